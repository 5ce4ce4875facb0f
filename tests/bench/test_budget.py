"""One trunk, many budgets: a cooldown branch off the trunk is, to the last digit, the run a user gets with
that budget's own warmup-stable-decay schedule (CPU, one torch thread), and a geometry that cannot branch
is refused."""

from __future__ import annotations

import pytest

from hf_hybrid.bench.budget import Budgets
from hf_hybrid.bench.execute import run_spec
from hf_hybrid.bench.methods import ENGINE_MS
from hf_hybrid.bench.recipe import build_task, preset_recipe
from hf_hybrid.bench.spec import BRANCH, SEGMENT, SEPARATE, RunSpec, schedule_json
from hf_hybrid.data import DataError

HYBRID = (
    "hybrid:warmup_steps=3,full_steps=1,confidence_threshold=0,min_history=2,max_predict_steps=2,"
    "check_every=0"
)


@pytest.fixture(scope="module")
def task():
    return build_task(preset_recipe("clm_stdlib", "tiny"))


def _spec(method, kind, start, stop, schedule, trunk_dir, budget=0.5):
    return RunSpec(method, 0, 1.0, 3e-3, kind, budget, start, stop, schedule_json(schedule), trunk_dir)


@pytest.mark.parametrize("method", ["plain", "dropbp:p=0.5", HYBRID])
def test_a_branch_is_the_separate_run_of_its_budget(task, tmp_path, method):
    budgets = Budgets(max_steps=20, cooldown=0.2, warmup_steps=2)
    fork, steps = budgets.fork(0.5), budgets.steps(0.5)
    assert (fork, steps) == (8, 10)
    trunk = str(tmp_path / "trunk")
    run_spec(task, _spec(method, SEGMENT, 0, 4, budgets.wsd(1.0), trunk))  # two segments: resume twice
    run_spec(task, _spec(method, SEGMENT, 4, fork, budgets.wsd(1.0), trunk))
    branch = run_spec(task, _spec(method, BRANCH, fork, steps, budgets.wsd(0.5), trunk))
    separate = run_spec(task, _spec(method, SEPARATE, 0, steps, budgets.wsd(0.5), None))
    assert branch.stop == separate.stop == steps
    assert branch.eval_loss == separate.eval_loss
    assert branch.losses == separate.losses[fork:]
    measured = {ENGINE_MS}  # the engine's own milliseconds: a time, measured on each run's clock
    counts = [{k: v for k, v in c.step_counts.items() if k not in measured} for c in (branch, separate)]
    assert counts[0] == counts[1]  # counters travel in the checkpoint
    if method == HYBRID:
        assert branch.step_counts[ENGINE_MS] > 0 and separate.step_counts[ENGINE_MS] > 0
        assert "predict" in branch.details["phases"]
        assert branch.details["phases"] == separate.details["phases"]


def test_the_trunk_decays_only_at_its_end_and_a_branch_at_its_own(task):
    budgets = Budgets(max_steps=200, cooldown=0.2)
    assert [budgets.fork(b) for b in (0.25, 0.5, 0.75)] == [40, 80, 120]
    assert budgets.trunk_stops() == [40, 80, 120, 200]
    assert budgets.wsd(0.5)["lr_scheduler_kwargs"] == {"num_decay_steps": 20, "decay_type": "1-sqrt"}
    assert budgets.wsd(1.0)["lr_scheduler_kwargs"]["num_decay_steps"] == 40


@pytest.mark.parametrize(
    ("budgets", "message"),
    [
        (Budgets(200, cooldown=0.0), r"`--cooldown_fraction` must be in \(0, 0.5\], got 0.0"),
        (Budgets(200, cooldown=0.6), r"`--cooldown_fraction` must be in \(0, 0.5\], got 0.6"),
        (Budgets(200, decay="step"), r"`--decay_shape` must be one of \['1-sqrt', 'linear', 'cosine'\]"),
        (Budgets(5), r"`--max_steps` 5 is too small for branches"),
        (
            Budgets(200, warmup_steps=50),
            r"the warmup \(50 steps\) ends after the 1/4 budget's cooldown begins",
        ),
    ],
)
def test_a_geometry_that_cannot_branch_is_refused(budgets, message):
    with pytest.raises(DataError, match=message):
        budgets.check()
