"""The protocol's decisions, end to end, on runs whose eval losses are written by hand: an executor that
trains nothing answers each spec from a loss function of (method, rate, budget, seed). The race, the
early stop, the other seeds and their band, an untuned judge, a kill anywhere."""

from __future__ import annotations

import json
import math
import os
import shutil

import pytest

from hf_hybrid.bench.arena import Arena, parse_methods
from hf_hybrid.bench.execute import Measured
from hf_hybrid.bench.executors import Finished
from hf_hybrid.bench.plan import Protocol
from hf_hybrid.bench.record import Record
from hf_hybrid.bench.report import _median_frontier, curve_table, markdown
from hf_hybrid.bench.spec import RANGE_TEST
from hf_hybrid.bench.task import BenchTask

STEPS = 200
PRICE = {"step": 3.0, "freeze:2:step": 2.0, "dropbp:p=0.5:step": 2.5, "forward": 1.0, "blind": 0.0}


def plain_loss(rate: float, budget: float, seed: int = 0) -> float:
    """A bowl in log-rate whose best rate falls as the budget grows (x4 at 1/4, x2 beyond), minus
    training: what a real sweep looks like."""
    best = 4.0 if budget <= 0.25 else 2.0
    return 3.0 - budget + 0.05 * math.log2(rate / best) ** 2 + 0.02 * seed


class Fake:
    """An executor that answers a spec at once from `loss(method, rate, budget, seed)`."""

    workers = 2

    def __init__(self, loss, stop_after: int | None = None, own_schedule: float = 0.0) -> None:
        self.loss, self.pending, self.stop_after, self.ran = loss, [], stop_after, []
        self.own_schedule = own_schedule  # added to the loss of a run in the task's own (linear) schedule
        self.submitted: list[tuple[str, list[str]]] = []  # each spec and what was in flight beside it

    def submit(self, spec):
        self.submitted.append((spec.key, [p.key for p in self.pending]))
        self.pending.append(spec)
        return "fake"

    def wait(self):
        if self.stop_after is not None and len(self.ran) >= self.stop_after:
            raise KeyboardInterrupt
        spec = self.pending.pop(0)
        self.ran.append(spec.key)
        if spec.saves:  # what the run leaves for its branch and its continuation
            os.makedirs(f"{spec.trunk_dir}/checkpoint-{spec.stop}", exist_ok=True)
        kind = {"freeze:2": "freeze:2:step", "dropbp:p=0.5": "dropbp:p=0.5:step"}.get(spec.method, "step")
        budget = spec.steps / STEPS
        loss = None
        if spec.evaluate:
            loss = self.loss(spec.method, spec.lr_multiplier, budget, spec.seed)
            loss += self.own_schedule if '"linear"' in spec.schedule_json else 0.0
        losses = (
            [3.0] * (spec.stop - spec.start) if spec.kind == RANGE_TEST else [2.0] * (spec.stop - spec.start)
        )
        measured = Measured(
            stop=spec.stop,
            eval_loss=loss,
            step_counts={kind: spec.stop},
            own_seconds=float(spec.stop - spec.start),
            wall_seconds=float(spec.stop - spec.start),
            clock="cpu_time",
            losses=losses,
            eval_example_losses=[loss + 0.01 * (i % 3) for i in range(30)]
            if spec.per_example and loss
            else None,
        )
        return [Finished(spec, "fake", measured)]

    def close(self):
        self.pending.clear()


def _task() -> BenchTask:
    return BenchTask(
        name="fake",
        task_type="causal_lm",
        build_model=lambda seed: None,
        train=[0] * 100,
        evaluation=[0] * 10,
        learning_rate=1e-3,
        max_steps=STEPS,
        batch_size=4,
    )


def arena(tmp_path, methods, loss, seeds=(0, 1, 2), stop_after=None, widen=3, name="out", check=False, own=0):
    out = tmp_path / name
    out.mkdir(exist_ok=True)
    task = _task()
    path = out / "results.json"
    if not path.exists():  # the prices of a timed calibration, written by hand
        record = Record.open(out, task.describe(), task.identity(), "test")
        record.data["calibration"] = {
            "forward_seconds": 1.0,
            "step_seconds": {k: v for k, v in PRICE.items() if k not in ("forward", "blind")},
        }
        record.save()
    record = Record.open(out, task.describe(), task.identity(), "test")
    parsed, nulls = parse_methods(methods)
    protocol = Protocol(seeds=seeds, lr_multipliers=(0.5, 1.0, 2.0, 4.0), widen=widen, schedule_check=check)
    executor = Fake(loss, stop_after, own)
    Arena(task, parsed, nulls, protocol, record, executor=executor, echo=lambda line: None).run()
    return json.loads(path.read_text()), executor


def _verdict(data, method):
    return next(v for v in data["verdicts"] if v["method"] == method)


def test_each_budget_gets_its_own_best_rate_and_only_two_rates_go_on(tmp_path):
    data, executor = arena(tmp_path, ["plain"], lambda m, r, b, s: plain_loss(r, b, s), seeds=(0,))
    assert data["plain"]["best_lr_multiplier"] == {"0.25": 4.0, "0.5": 2.0, "0.75": 2.0, "1.0": 2.0}
    sweep = data["decisions"]["sweep"]["active"]
    assert sweep["0.25"] == [0.5, 1.0, 2.0, 4.0, 8.0]  # x4 best at the top edge: x8 added
    assert sweep["0.5"] == [1.0, 2.0, 4.0] and sweep["1.0"] == [1.0, 2.0]
    assert data["plain"]["untuned"] == {}


def test_a_best_rate_at_the_edge_after_the_widenings_is_called_untuned(tmp_path):
    rising = lambda m, r, b, s: 3.0 - b - 0.01 * r  # noqa: E731 - always better at a larger rate
    data, _ = arena(tmp_path, ["plain", "freeze:2"], rising, seeds=(0,), widen=1)
    assert set(data["plain"]["untuned"]) == {"0.25", "0.5", "0.75", "1.0"}
    assert "the judge is not tuned at" in _verdict(data, "freeze:2")["reason"]


def test_a_method_far_below_the_frontier_at_half_stops_there(tmp_path):
    def loss(m, r, b, s):
        return plain_loss(r, b, s) + (0.4 if m == "freeze:2" else 0.0)

    data, executor = arena(tmp_path, ["plain", "freeze:2"], loss)
    verdict = _verdict(data, "freeze:2")
    assert verdict["verdict"] == "loses" and verdict["stopped_at"] == 0.5
    assert not any(k.startswith("freeze:2") and ("of 200" in k and "-200 " in k) for k in executor.ran)
    assert verdict["seeds"] == [0]


def test_a_method_that_may_win_gets_the_other_seeds_and_wins_past_the_band(tmp_path):
    def loss(m, r, b, s):
        return plain_loss(r, b, s) - (0.15 if m == "freeze:2" else 0.0)

    data, _ = arena(tmp_path, ["plain", "freeze:2"], loss)
    verdict = _verdict(data, "freeze:2")
    assert verdict["seeds"] == [0, 1, 2]
    assert verdict["verdict"] == "wins", verdict["reason"]


def test_a_tie_within_the_band_stays_on_one_seed(tmp_path):
    def loss(m, r, b, s):
        # its steps cost 2.5 units against plain's 3: at +0.167 b it reaches what plain reaches for the
        # same compute (full budget: 2.25 at 450 units, 2.0 at 600, so 2.167 at 500; half: 2.583 at 250)
        return plain_loss(r, b, s) + (0.167 * b if m == "dropbp:p=0.5" else 0.0)

    data, _ = arena(tmp_path, ["plain", "dropbp:p=0.5"], loss)
    band = data["plain"]["seed_band"]
    verdict = _verdict(data, "dropbp:p=0.5")
    reading = verdict["per_seed"][0]["speedup_units"]
    assert 1 - band <= reading <= 1 + band and verdict["seeds"] == [0] and verdict["verdict"] == "ties"


def test_the_largest_rate_winning_at_a_quarter_races_on_to_half(tmp_path):
    def loss(m, r, b, s):  # the method likes x4 early and x2 later: a short-horizon bias
        if m == "freeze:2":
            return plain_loss(r, b, s) - 0.1
        return plain_loss(r, b, s)

    data, _ = arena(tmp_path, ["plain", "freeze:2"], loss, seeds=(0,))
    race = data["decisions"]["methods"]["freeze:2"]["race"]
    assert race["0.25"] == {"rates": [2.0, 4.0], "winner": 4.0}
    assert race["0.5"] == {"rates": [2.0, 4.0], "winner": 2.0}
    assert _verdict(data, "freeze:2")["lr_multiplier"] == 2.0


def test_a_rate_that_wins_early_and_overfits_late_is_dropped_at_the_budget_where_it_loses(tmp_path):
    def loss(m, r, b, s):  # the method likes x4 up to 1/2 and x2 from 3/4 on: decided only at 3/4
        if m == "freeze:2":
            best = 4.0 if b <= 0.5 else 2.0
            return 3.0 - b + 0.05 * math.log2(r / best) ** 2 - 0.1
        return plain_loss(r, b, s)

    data, _ = arena(tmp_path, ["plain", "freeze:2"], loss, seeds=(0,))
    record = data["decisions"]["methods"]["freeze:2"]
    assert [record["race"][b]["rates"] for b in ("0.25", "0.5", "0.75", "1.0")] == [[2.0, 4.0]] * 3 + [[2.0]]
    assert record["lr_multiplier_by_budget"] == {"0.25": 4.0, "0.5": 4.0, "0.75": 2.0, "1.0": 2.0}
    verdict = _verdict(data, "freeze:2")
    assert verdict["lr_multiplier"] == 2.0
    assert [c["lr_multiplier"] for c in verdict["curve"]] == [4.0, 4.0, 2.0, 2.0]
    full = next(r for r in data["runs"] if r["method"] == "freeze:2" and r["point"] and r["budget"] == 1.0)
    assert (
        verdict["per_seed"][0]["eval_loss"]
        == full["eval_loss"]
        == pytest.approx(loss("freeze:2", 2.0, 1.0, 0))
    )
    curve_row = next(line for line in curve_table(data) if "`freeze:2`" in line)
    assert curve_row.count("at x4") == 2 and curve_row.count("at x") == 2


def test_on_a_task_that_overfits_every_reading_is_at_its_best_budget(tmp_path):
    """Eval loss rises after 3/4 for plain and method alike: plain's frontier is read at its best point so
    far, and so are the method (its other seeds run at that budget) and the band."""

    def loss(m, r, b, s):
        overfit = 2.0 * max(0.0, b - 0.75)
        return plain_loss(r, b, s) + overfit - (0.05 if m == "freeze:2" else 0.0)

    data, executor = arena(tmp_path, ["plain", "freeze:2"], loss)
    record = data["decisions"]["methods"]["freeze:2"]
    assert record["read_at"] == 0.75 and record["lr_multiplier"] == record["lr_multiplier_by_budget"]["0.75"]
    verdict = _verdict(data, "freeze:2")
    assert [r["budget"] for r in verdict["per_seed"]] == [0.75, 0.75, 0.75]
    other_seeds = [r for r in data["runs"] if r["method"] == "freeze:2" and r["seed"] > 0]
    assert {(r["kind"], r["budget"]) for r in other_seeds} == {("separate", 0.75)}
    # freeze:2's steps cost 2 units against plain's 3: at its best budget it is 1.5x cheaper for a lower
    # loss, a lower bound; read at the end, where plain's own full run reads 0.6x, it would read < 1
    first = verdict["per_seed"][0]
    assert first["speedup_units"] >= 1.5 and first["speedup_units_kind"] != "interpolated"
    assert next(c for c in verdict["curve"] if c["budget"] == 1.0)["speedup_units"] < 1.0
    # the band compares the seeds' best points (plain_loss's seeds differ by 0.02), not their overfit ends
    assert data["plain"]["seed_band"] < 0.3
    assert verdict["verdict"] == "wins", verdict["reason"]


def test_the_early_stop_is_decided_once_at_half_by_half_s_winner(tmp_path):
    def loss(m, r, b, s):  # x2 is far worse than x4 at 1/2 (x4 wins there) and the better rate from 3/4
        if m == "freeze:2":
            bad_at_half = 0.6 if (r, b) == (2.0, 0.5) else 0.0
            return plain_loss(r, b, s) - 0.1 - (0.1 if (r == 2.0 and b > 0.5) else 0.0) + bad_at_half
        return plain_loss(r, b, s)

    data, _ = arena(tmp_path, ["plain", "freeze:2"], loss, seeds=(0,))
    record = data["decisions"]["methods"]["freeze:2"]
    assert record["lr_multiplier_by_budget"] == {"0.25": 4.0, "0.5": 4.0, "0.75": 2.0, "1.0": 2.0}
    assert "stopped_at" not in record and _verdict(data, "freeze:2")["stopped_at"] is None


def _check_run(key: str) -> bool:
    return key.startswith("plain") and "separate linear" in key


def test_the_other_seeds_start_at_a_budget_as_soon_as_the_sweep_has_passed_it(tmp_path):
    _, executor = arena(tmp_path, ["plain"], lambda m, r, b, s: plain_loss(r, b, s))
    first_other_seed = next(i for i, k in enumerate(executor.ran) if "seed 1" in k)
    last_sweep_point = max(i for i, k in enumerate(executor.ran) if "seed 0" in k and "branch" in k)
    assert first_other_seed < last_sweep_point


def test_the_methods_run_beside_the_schedule_check_and_it_keeps_the_trunk(tmp_path):
    def loss(m, r, b, s):
        return plain_loss(r, b, s) + {"freeze:2": -0.1}.get(m, 0.0)

    data, executor = arena(tmp_path, ["plain", "freeze:2"], loss, seeds=(0,), check=True, own=0.01)
    beside = [k for k, flight in executor.submitted if "freeze" in k and any(map(_check_run, flight))]
    assert beside  # a method's run started while a run of the check was in flight
    assert data["decisions"]["mode"] == "wsd" and data["decisions"]["schedule_check"]["fallback"] is False
    assert sum(map(_check_run, executor.ran)) == 3 and not data["unused"]
    assert _verdict(data, "freeze:2")["speedup_units"] > 1.0


def test_a_trunk_worse_than_the_task_s_own_schedule_sends_every_run_to_separate_runs(tmp_path):
    """The fallback, reached after the methods ran beside the check: their trunk runs are left unused,
    every reading is taken again from separate runs in the task's own schedule, and nothing of the trunk
    is started once it is decided (here: a second seed asked for afterwards)."""

    def loss(m, r, b, s):
        return plain_loss(r, b, s) + {"freeze:2": -0.1}.get(m, 0.0)

    methods = ["plain", "freeze:2"]
    arena(tmp_path, methods, loss, seeds=(0,), check=True, own=-0.05)
    data, executor = arena(tmp_path, methods, loss, seeds=(0, 1), check=True, own=-0.05)
    assert executor.ran and not [k for k in executor.ran if "warmup_stable_decay" in k]
    check = data["decisions"]["schedule_check"]
    assert data["decisions"]["mode"] == "separate" and check["fallback"] is True
    assert check["trunk_eval_loss"] - check["own_schedule_eval_loss"] == pytest.approx(0.05)
    assert any(k.startswith("freeze:2") and "segment" in k for k in data["unused"])
    used = [r for r in data["runs"] if r["key"] not in data["unused"] and r["method"] == "freeze:2"]
    assert used and all(r["kind"] == "separate" for r in used)  # the wsd sweep stays: the check stood on it
    assert _verdict(data, "freeze:2")["speedup_units"] > 1.0
    # the report reads the separate runs too: a frontier point at every budget, the task's own schedule
    assert len(_median_frontier(data)) == 4 and 'lr_scheduler_type="linear")' in markdown(data)


@pytest.mark.parametrize("stop_after", [1, 5, 13, 29])
def test_an_arena_stopped_anywhere_and_rerun_is_the_uninterrupted_one(tmp_path, stop_after):
    def loss(m, r, b, s):
        return plain_loss(r, b, s) + {"freeze:2": -0.1, "dropbp:p=0.5": 0.4}.get(m, 0.0)

    methods = ["plain", "freeze:2", "dropbp:p=0.5"]
    whole, _ = arena(tmp_path, methods, loss, name="whole")
    with pytest.raises(KeyboardInterrupt):
        arena(tmp_path, methods, loss, stop_after=stop_after, name="killed")
    again, _ = arena(tmp_path, methods, loss, name="killed")

    def facts(data):
        runs = sorted((r["key"], r["eval_loss"], r["units"]) for r in data["runs"])
        return runs, data["decisions"], [(v["method"], v["verdict"], v["seeds"]) for v in data["verdicts"]]

    assert facts(again) == facts(whole)


@pytest.mark.parametrize("stop_after", [13, 29])
def test_checkpoints_lost_with_the_coordinator_are_rebuilt_segment_by_segment(tmp_path, stop_after):
    """A trunk whose every checkpoint is gone continues after rebuilding its recorded segments in turn:
    the cleaner must not delete the one the next rebuild starts from."""

    def loss(m, r, b, s):
        return plain_loss(r, b, s) + {"freeze:2": -0.1}.get(m, 0.0)

    methods = ["plain", "freeze:2"]
    whole, _ = arena(tmp_path, methods, loss, name="whole")
    with pytest.raises(KeyboardInterrupt):
        arena(tmp_path, methods, loss, stop_after=stop_after, name="killed")
    shutil.rmtree(tmp_path / "killed" / "checkpoints")
    again, executor = arena(tmp_path, methods, loss, name="killed")
    runs = lambda data: sorted((r["key"], r["eval_loss"]) for r in data["runs"])  # noqa: E731
    assert runs(again) == runs(whole) and again["verdicts"] == whole["verdicts"]
    assert len(executor.ran) > len(again["runs"]) - stop_after  # recorded segments were run again
