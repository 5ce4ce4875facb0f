"""A tiny arena end to end with the real trainer: its record, report and plot; the units; plain's race;
the null controls; resume; a killed and rerun arena is the uninterrupted one; records of another task or
protocol are refused. No timing is asserted. The protocol's decisions themselves are tested on runs that
train nothing (test_plan.py, test_protocol.py)."""

from __future__ import annotations

import dataclasses
import importlib
import json

import pytest

from hf_hybrid.bench import Protocol, run_arena
from hf_hybrid.bench import protocol as rules
from hf_hybrid.bench.arena import Arena, parse_methods
from hf_hybrid.bench.executors import InProcess
from hf_hybrid.bench.methods import ENGINE_MS
from hf_hybrid.bench.recipe import build_task, preset_recipe
from hf_hybrid.bench.record import Record
from hf_hybrid.data import DataError

HYBRID = (
    "hybrid:warmup_steps=5,full_steps=2,confidence_threshold=0,min_history=3,max_predict_steps=4,"
    "check_every=0"
)
METHODS = [
    "plain",
    HYBRID,
    "hybrid",
    "null",
    "freeze:1",
    "selective-backprop:start=0,end=1,every=1",
    "dropbp:p=0.5",
    "bench_plugins:CountingCallback",
]
TINY = Protocol(seeds=(0, 1), lr_multipliers=(1.0, 2.0), widen=0, warm_steps=1, timed_steps=2)
# one seed, no schedule check: the tests of a killed or failing arena, not of the protocol
SMALL = Protocol(
    seeds=(0,), lr_multipliers=(1.0, 2.0), widen=0, schedule_check=False, warm_steps=1, timed_steps=2
)


def tiny_task():
    return build_task(preset_recipe("clm_stdlib", "tiny"))


@pytest.fixture(scope="module")
def arena(tmp_path_factory):
    out = tmp_path_factory.mktemp("arena")
    lines: list[str] = []
    run_arena(tiny_task(), METHODS, TINY, out, echo=lines.append)
    return out, json.loads((out / "results.json").read_text()), "\n".join(lines)


def test_the_arena_writes_its_record_report_and_plot(arena):
    out, data, printed = arena
    assert data["schema_version"] == 3
    assert (out / "arena.png").stat().st_size > 10_000
    report = (out / "report.md").read_text()
    assert "Plain's rate per budget" in report and "| method | lr (x plain's) |" in report
    assert "The protocol's rules as this record ran them" in report and "Schedule check at" in report
    assert data["protocol"]["rules"] == dict(rules.rules())
    assert len(data["eval_clusters"]) == len(data["eval_example_tokens"]) == data["task"]["eval_examples"]
    assert len({r["key"] for r in data["runs"]}) == len(data["runs"])
    judged = {v["method"] for v in data["verdicts"]}
    assert judged >= {"plain", HYBRID, "hybrid", "freeze:1", "dropbp:p=0.5", "bench_plugins:CountingCallback"}
    assert {
        f"null-{HYBRID}",
        "null-hybrid",
        "selective-backprop:start=0,end=1,every=1,rule=uniform",
    } <= judged
    assert not (out / "checkpoints").exists()  # deleted once the record is complete
    assert "done" in printed and "[here]" in printed


def test_plain_s_race_picks_the_lowest_eval_loss_at_each_rung_and_the_winner_goes_on(arena):
    _, data, _ = arena
    race = data["decisions"]["plain"]
    best = data["plain"]["best_lr_multiplier"]
    assert best == race["best"] and set(best) == {str(b) for b in rules.BUDGETS}
    for rung in rules.RACE_RUNGS:
        rates = race["rungs"][str(rung)]
        points = [
            r
            for r in data["runs"]
            if r["method"] == "plain"
            and r["seed"] == 0
            and r["point"]
            and r["budget"] == rung
            and r["lr_multiplier"] in rates
            and r["kind"] != "separate"
        ]
        assert {r["lr_multiplier"] for r in points} == set(rates)
        assert (
            min(points, key=lambda r: (r["eval_loss"], r["lr_multiplier"]))["lr_multiplier"]
            == best[str(rung)]
        )
    winner = best[str(rules.RACE_RUNGS[-1])]
    assert all(best[str(b)] == winner for b in rules.BUDGETS if b > rules.RACE_RUNGS[-1])


def test_a_points_cost_includes_the_trunk_it_branched_from(arena):
    _, data, _ = arena
    units = data["calibration"]["units"]
    priced = [r for r in data["runs"] if not r.get("error") and not r.get("reused_from")]
    assert any(r["kind"] == "branch" for r in priced)
    for run in priced:
        assert run["units"] == pytest.approx(sum(n * units[k] for k, n in run["step_counts"].items()))
        if run["kind"] == "branch":
            steps = {k: n for k, n in run["step_counts"].items() if k != ENGINE_MS}  # that one is ms
            assert sum(steps.values()) == run["stop"]  # from step 0, not from the fork
            assert run["seconds"] > run["own_seconds"]


def test_the_null_control_replays_the_hybrid_runs_phases_with_nothing_applied(arena):
    _, data, _ = arena
    by_key = {r["key"]: r for r in data["runs"]}
    nulls = [r for r in data["runs"] if r["method"] == f"null-{HYBRID}"]
    assert nulls
    for null in nulls:
        parent = by_key[null["replays"]]
        if parent["reused_from"]:  # a point inside the warmup is plain's run, and so is its null
            assert null["reused_from"] == parent["reused_from"]
            continue
        assert null["details"]["phases"] == parent["details"]["phases"]
        assert _steps(null) == _steps(parent)
        assert null["step_counts"][ENGINE_MS] > 0  # its engine's own time, measured: priced too
    assert any("predict" in r["details"]["phases"] for r in nulls if not r["reused_from"])


def test_the_null_of_a_run_that_predicted_nothing_is_the_plain_run_reused(arena):
    _, data, _ = arena
    by_key = {r["key"]: r for r in data["runs"]}
    reused = [r for r in data["runs"] if r["method"] == "null-hybrid"]
    assert reused and all(r["reused_from"] for r in reused)
    for row in reused:
        twin = by_key[row["reused_from"]]
        assert twin["method"] == "plain" and twin["eval_loss"] == row["eval_loss"]


def test_a_method_s_other_seeds_run_as_its_decision_says(arena):
    """Whether they can change the verdict is the protocol's rule (test_protocol.py, test_plan.py); here,
    that the record's verdicts read the seeds its decisions ran, and plain's on every seed."""
    _, data, _ = arena
    decisions = data["decisions"]["methods"]
    assert data["verdicts"][0]["seeds"] == [0, 1]
    judged = [v for v in data["verdicts"][1:] if "other_seeds" in decisions.get(v["method"], {})]
    assert judged
    for verdict in judged:
        ran = decisions[verdict["method"]]["other_seeds"].startswith("run")
        assert verdict["seeds"] == ([0, 1] if ran else [0]), verdict["method"]


def test_the_same_command_again_trains_nothing_and_keeps_the_calibration(arena, monkeypatch):
    out, data, _ = arena
    import hf_hybrid.bench.calibration as calibration
    import hf_hybrid.bench.executors as executors

    def refuse(*args, **kwargs):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(executors, "run_spec", refuse)
    monkeypatch.setattr(calibration, "_step_seconds", refuse)
    monkeypatch.setattr(calibration, "_forward_seconds", refuse)
    run_arena(tiny_task(), METHODS, TINY, out, echo=lambda line: None)
    again = json.loads((out / "results.json").read_text())
    assert again["runs"] == data["runs"] and again["verdicts"] == data["verdicts"]


def test_a_run_no_longer_in_the_plan_is_listed_as_such(arena, tmp_path):
    out, data, _ = arena
    (tmp_path / "results.json").write_text((out / "results.json").read_text())
    run_arena(tiny_task(), ["plain", "freeze:1"], TINY, tmp_path, echo=lambda line: None)
    smaller = json.loads((tmp_path / "results.json").read_text())
    unused = set(smaller["unused"])
    assert any(k.startswith("dropbp") for k in unused) and not any(k.startswith("freeze") for k in unused)
    assert "no longer in the plan" in (tmp_path / "report.md").read_text()


def test_records_of_another_task_or_protocol_are_refused(arena, tmp_path):
    out, _, _ = arena
    task = tiny_task()
    task.max_steps = 12
    with pytest.raises(DataError, match=r"belongs to another task \(differs in \['max_steps'\]\)"):
        run_arena(task, ["plain"], TINY, out)
    old = json.loads((out / "results.json").read_text())
    old["schema_version"] = 2  # the second protocol's (benchmarks/results/arena_v2)
    (tmp_path / "results.json").write_text(json.dumps(old))
    with pytest.raises(DataError, match=r"protocol version 2 .* rerun with --fresh to move it aside"):
        run_arena(tiny_task(), ["plain"], TINY, tmp_path)
    record = Record.open(tmp_path, {}, "x", "cmd", fresh=True)
    assert (tmp_path / "results.v2.json").is_file() and record.runs == []


class Interrupted(InProcess):
    """Stops the coordinator (as a kill would) after `after` finished runs."""

    def __init__(self, task, after):
        super().__init__(task)
        self.after = after

    def wait(self):
        if self.after == 0:
            raise KeyboardInterrupt
        self.after -= 1
        return super().wait()


def _arena(task, methods, out, executor=None, protocol=SMALL):
    parsed, nulls = parse_methods(methods)
    record = Record.open(out, task.describe(), task.identity(), "test")
    arena = Arena(task, parsed, nulls, protocol, record, executor=executor, echo=lambda line: None)
    arena.check()
    arena.run()
    return json.loads((out / "results.json").read_text())


def _steps(run: dict) -> dict:
    """A run's step counts without the engine's measured milliseconds (a time, like its seconds)."""
    return {k: n for k, n in run["step_counts"].items() if k != ENGINE_MS}


def _facts(data):
    """What a resumed arena must repeat to the digit: every measured time left out (seconds, and the
    hybrid engine's own milliseconds, priced into its units and so into its speed-up)."""
    timed = {r["method"] for r in data["runs"] if ENGINE_MS in r["step_counts"]}
    runs = {
        r["key"]: (r["eval_loss"], None if r["method"] in timed else r["units"], _steps(r), r["losses"])
        for r in data["runs"]
    }
    verdicts = [
        (v["method"], v["verdict"], v["seeds"], None if v["method"] in timed else v["speedup_units"])
        for v in data["verdicts"]
    ]
    return runs, verdicts, data["decisions"]


def test_a_killed_and_rerun_arena_is_the_uninterrupted_one(tmp_path):
    task = tiny_task()
    methods = ["plain", HYBRID, "null"]  # trunks, branches and a null's replays, resumed
    uninterrupted = _arena(task, methods, tmp_path / "whole")
    whole = _facts(uninterrupted)
    # halfway through its trained runs (the protocol-level test stops it at four points: test_plan.py)
    after = sum(not r["reused_from"] for r in uninterrupted["runs"]) // 2
    out = tmp_path / "killed"
    out.mkdir()
    # the same machine's prices: each record times its steps once, and units are priced by them
    empty = {**uninterrupted, "runs": [], "decisions": {}, "plain": {}, "verdicts": [], "unused": []}
    (out / "results.json").write_text(json.dumps(empty))
    with pytest.raises(KeyboardInterrupt):
        _arena(task, methods, out, Interrupted(task, after))
    trained = [r for r in json.loads((out / "results.json").read_text())["runs"] if not r["reused_from"]]
    assert len(trained) == after  # besides the rows reused from a recorded run, without training
    assert _facts(_arena(task, methods, out)) == whole


def test_an_arena_stopped_by_hand_leaves_its_report_so_far(tmp_path, monkeypatch):
    task = tiny_task()
    where = importlib.import_module(run_arena.__module__)  # the module whose executor run_arena makes
    monkeypatch.setattr(where, "make_executor", lambda *args, **kwargs: Interrupted(task, 3))
    lines = []
    with pytest.raises(KeyboardInterrupt):
        run_arena(task, ["plain", "freeze:1"], TINY, tmp_path, echo=lines.append)
    report = (tmp_path / "report.md").read_text()
    assert "Plain's race has not finished." in report and report.count("| `plain` |") == 3
    assert (tmp_path / "arena.png").stat().st_size > 10_000
    assert "the same command resumes" in lines[-1]


def test_a_run_that_fails_twice_is_recorded_with_its_error_and_the_rest_goes_on(tmp_path):
    methods = ["plain", "bench_plugins:FailsLate", "bench_plugins:FailsAtOnce", "freeze:1"]
    data = _arena(tiny_task(), methods, tmp_path)
    failed = [r for r in data["runs"] if r.get("error")]
    assert failed and all("RuntimeError: this method fails at step 4" in r["error"] for r in failed)
    assert all(r["attempts"] == 2 and r["method"] == "bench_plugins:FailsLate" for r in failed)
    assert any(v["method"] == "freeze:1" for v in data["verdicts"])
    assert any("failed twice" in note for note in data["notes"])
    assert any("`bench_plugins:FailsAtOnce` raised while its steps were timed" in n for n in data["notes"])
    losing = next(v for v in data["verdicts"] if v["method"] == "bench_plugins:FailsLate")
    assert losing["speedup_units"] == 0.0 and losing["verdict"] == "loses"


def test_a_method_that_provably_trains_like_plain_reuses_plains_runs(arena):
    _, data, _ = arena
    rows = [r for r in data["runs"] if r["method"] == "hybrid"]  # its 100 warmup steps cover the 20
    assert rows and all(r["reused_from"] for r in rows)
    verdict = next(v for v in data["verdicts"] if v["method"] == "hybrid")
    assert verdict["speedup_units"] == 1.0
    assert "the plain runs, reused: its warmup (100 steps) covers the whole budget" in verdict["reason"]


def test_plain_under_other_names_ties_end_to_end(tmp_path):
    """The A/A test on a built-in task, real runs: plain with a logging field changed is raced like any
    method and reads 1.00x and a tie in units (priced as plain: only bookkeeping changed); fused AdamW
    named explicitly (the Trainer's default) is recognised as plain's trajectory, its loss plain's to the
    digit, and judged in time on five interleaved timed pairs. The rates of false wins and losses of the
    time rule are the A/A unit test's (`test_null_records.py`): one real timing cannot show a rate."""
    task = dataclasses.replace(tiny_task(), learning_rate=8e-3)  # the tiny task's bowl, inside the grid
    logging, fused = "args:logging_steps=7", "args:optim=adamw_torch_fused"
    protocol = dataclasses.replace(SMALL, lr_multipliers=(0.5, 1.0, 2.0), widen=1)
    data = _arena(task, ["plain", logging, fused], tmp_path, protocol=protocol)
    renamed = next(v for v in data["verdicts"] if v["method"] == logging)
    assert renamed["speedup_units"] == pytest.approx(1.0) and renamed["verdict"] == rules.TIES
    assert renamed["loss_delta"] == 0.0
    identity = next(v for v in data["verdicts"] if v["method"] == fused)
    assert identity["same_trajectory"] and identity["loss_delta"] == 0.0
    assert identity["timing"]["pairs"] == rules.TIMED_PAIRS
    assert identity["timing"]["low"] <= identity["speedup_time"] <= identity["timing"]["high"]
    assert identity["verdict"] in (rules.WINS, rules.TIES, rules.LOSES)
