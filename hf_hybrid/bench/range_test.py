"""A learning-rate range test (Smith, 2017; fastai's `lr_find`): the sweep's centre when none is given.

One short plain run whose rate grows geometrically from `LOWEST` to `HIGHEST`, its training loss
smoothed (an exponential average, bias-corrected); the centre is a tenth of the rate where the smoothed
loss is lowest once it averages 5 losses, before it blows up (more than 4x that minimum). A default rate
such as 5e-5 is far too low for a model trained from scratch and can be too high for a large fine-tune;
the sweep then widens from this centre until its best rate is interior, so the test only has to land
within a few factors of two (`benchmarks/range_test_calibration.py`: 0.3x-4x of the raced rate on six
of seven tasks, 10x on a model trained from scratch).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from transformers import TrainerCallback

from .budget import Budgets
from .spec import RANGE_TEST, RunSpec, schedule_json

LOWEST, HIGHEST = 1e-7, 10.0
SMOOTHING = 0.9
BLOW_UP = 4.0
# the minimum is looked for once the average holds this many losses: before, it is a batch or two, and on
# a fine-tune whose loss barely moves before it blows up (a pretrained decoder with LoRA) the second
# batch's low loss was the minimum, a centre 10^5 below the rate its race chose
MIN_AVERAGED = 5


def range_test_steps(max_steps: int) -> int:
    return min(100, max(20, max_steps // 4))


def range_test_spec(budgets: Budgets, seed: int) -> RunSpec:
    steps = range_test_steps(budgets.max_steps)
    return RunSpec(
        method="plain",
        seed=seed,
        lr_multiplier=1.0,
        learning_rate=HIGHEST,
        kind=RANGE_TEST,
        budget=0.0,
        start=0,
        stop=steps,
        schedule_json=schedule_json({"max_steps": steps, "lr_scheduler_type": "constant", "warmup_steps": 0}),
        evaluate=False,
    )


def ramp(step: int, steps: int) -> float:
    """The rate of optimizer step `step` (0-based) of `steps`."""
    return LOWEST * (HIGHEST / LOWEST) ** (step / max(1, steps - 1))


def suggested_rate(losses: Sequence[float], steps: int) -> float:
    """A tenth of the rate at the smoothed loss's minimum (two significant digits), from the test's
    per-step training losses over its `steps` steps."""
    best, best_step, average = math.inf, 0, 0.0
    for step, loss in enumerate(losses):
        if not math.isfinite(loss):
            break
        average = SMOOTHING * average + (1 - SMOOTHING) * loss
        smoothed = average / (1 - SMOOTHING ** (step + 1))
        if smoothed > BLOW_UP * best:
            break
        if smoothed < best and step >= MIN_AVERAGED - 1:
            best, best_step = smoothed, step
    rate = ramp(best_step, steps) / 10
    return float(f"{rate:.2g}")


class RangeRamp(TrainerCallback):
    """Sets every parameter group's rate before each step."""

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def on_step_begin(self, args: Any, state: Any, control: Any, optimizer: Any = None, **kw: Any) -> None:
        for group in optimizer.param_groups:
            group["lr"] = ramp(state.global_step, self.steps)
