"""A tiny arena end to end: its record, report and plot; the units; the null controls; resume; a killed
and rerun arena is the uninterrupted one; records of another task or protocol are refused. No timing is
asserted."""

from __future__ import annotations

import json

import pytest

from hf_hybrid.bench import Protocol, run_arena
from hf_hybrid.bench.arena import Arena, parse_methods
from hf_hybrid.bench.executors import InProcess
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
TINY = Protocol(seeds=(0, 1), lr_multipliers=(1.0, 2.0), widen=1, warm_steps=1, timed_steps=2)


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
    assert data["schema_version"] == 2
    assert (out / "arena.png").stat().st_size > 10_000
    report = (out / "report.md").read_text()
    assert "Plain's best rate per budget" in report and "Speed-up at every budget" in report
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


def test_every_budget_has_its_own_tuned_plain_rate_and_the_sweep_says_where(arena):
    _, data, _ = arena
    sweep = data["decisions"]["sweep"]
    best = data["plain"]["best_lr_multiplier"]
    assert set(best) == {"0.25", "0.5", "0.75", "1.0"}
    for budget, rate in best.items():
        assert rate in sweep["active"][budget]
        points = [
            r
            for r in data["runs"]
            if r["method"] == "plain"
            and r["seed"] == 0
            and r["point"]
            and str(r["budget"]) == budget
            and r["lr_multiplier"] in sweep["active"][budget]
            and r["kind"] != "separate"
        ]
        assert min(points, key=lambda r: (r["eval_loss"], r["lr_multiplier"]))["lr_multiplier"] == rate


def test_a_points_cost_includes_the_trunk_it_branched_from(arena):
    _, data, _ = arena
    units = data["calibration"]["units"]
    priced = [r for r in data["runs"] if not r.get("error") and not r.get("reused_from")]
    assert any(r["kind"] == "branch" for r in priced)
    for run in priced:
        assert run["units"] == pytest.approx(sum(n * units[k] for k, n in run["step_counts"].items()))
        if run["kind"] == "branch":
            assert sum(run["step_counts"].values()) == run["stop"]  # from step 0, not from the fork
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
        assert null["step_counts"] == parent["step_counts"]
    assert any("predict" in r["details"]["phases"] for r in nulls if not r["reused_from"])


def test_the_null_of_a_run_that_predicted_nothing_is_the_plain_run_reused(arena):
    _, data, _ = arena
    by_key = {r["key"]: r for r in data["runs"]}
    reused = [r for r in data["runs"] if r["method"] == "null-hybrid"]
    assert reused and all(r["reused_from"] for r in reused)
    for row in reused:
        twin = by_key[row["reused_from"]]
        assert twin["method"] == "plain" and twin["eval_loss"] == row["eval_loss"]


def test_the_other_seeds_run_only_where_they_can_change_a_verdict(arena):
    _, data, _ = arena
    band = data["plain"]["seed_band"]
    judged = [
        v
        for v in data["verdicts"][1:]
        if not (v.get("null_control_of") or v.get("same_trajectory") or v.get("stopped_at"))
    ]
    assert judged
    for verdict in judged:
        first = next(r for r in verdict["curve"] if r["budget"] == 1.0)["speedup_units"]
        could_change = first > 1 + band or 1 - 2 * band <= first < 1 - band
        assert verdict["seeds"] == ([0, 1] if could_change else [0]), verdict["method"]


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
    old["schema_version"] = 1
    (tmp_path / "results.json").write_text(json.dumps(old))
    with pytest.raises(DataError, match=r"protocol version 1 .* rerun with --fresh to move it aside"):
        run_arena(tiny_task(), ["plain"], TINY, tmp_path)
    record = Record.open(tmp_path, {}, "x", "cmd", fresh=True)
    assert (tmp_path / "results.v1.json").is_file() and record.runs == []


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


def _arena(task, methods, out, executor=None):
    parsed, nulls = parse_methods(methods)
    record = Record.open(out, task.describe(), task.identity(), "test")
    arena = Arena(task, parsed, nulls, TINY, record, executor=executor, echo=lambda line: None)
    arena.check()
    arena.run()
    return json.loads((out / "results.json").read_text())


def _facts(data):
    runs = {r["key"]: (r["eval_loss"], r["units"], r["step_counts"], r["losses"]) for r in data["runs"]}
    verdicts = [(v["method"], v["verdict"], v["seeds"], v["speedup_units"]) for v in data["verdicts"]]
    return runs, verdicts, data["decisions"]


def test_a_killed_and_rerun_arena_is_the_uninterrupted_one(tmp_path):
    task = tiny_task()
    methods = ["plain", HYBRID, "null", "freeze:1"]
    uninterrupted = _arena(task, methods, tmp_path / "whole")
    whole = _facts(uninterrupted)
    for after in (17,):  # the protocol-level test stops it at four points (test_plan.py)
        out = tmp_path / f"killed-{after}"
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
    import hf_hybrid.bench as bench

    task = tiny_task()
    monkeypatch.setattr(bench, "make_executor", lambda *args, **kwargs: Interrupted(task, 3))
    lines = []
    with pytest.raises(KeyboardInterrupt):
        bench.run_arena(task, ["plain", "freeze:1"], TINY, tmp_path, echo=lines.append)
    report = (tmp_path / "report.md").read_text()
    assert "The plain sweep has not finished." in report and report.count("| `plain` |") == 3
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
