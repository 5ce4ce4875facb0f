"""A learning-rate range test (Smith, 2017; fastai's `lr_find`): the sweep's centre when none is given.

One short plain run whose rate grows geometrically from `LOWEST` to `HIGHEST`, its training loss
smoothed (an exponential average, bias-corrected). The centre is the rate where the smoothed loss blows
up (more than 4x its minimum so far, or a loss that is not finite) over `BLOW_UP_DIVISOR`.

Why the blow-up and not fastai's minimum/10: on a fine-tune the loss barely moves before it blows up, so
its minimum is a noisy pick among flat batches (0.3x-10x of the raced rate on seven tasks), while the
point where it blows up is sharp. The ramp passes eight decades in 20-100 steps and the average lags,
so the loss blows up far above any rate that trains well: on the seven tasks of
`benchmarks/range_test_calibration.py` the raced rate was about 1/2500 of it (each task's ratio with
the divisor fitted on the other six: 0.41x-2.9x). A default rate such as 5e-5 is far too low for a model
trained from scratch and can be too high for a large fine-tune; the sweep widens from this centre until
its best rate is interior, so the test only has to land within a few factors of two.
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
BLOW_UP_DIVISOR = 2500.0
# the minimum the blow-up is measured from is looked for once the average holds this many losses: before,
# it is a batch or two
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


def blow_up_step(losses: Sequence[float]) -> int:
    """The first step whose loss is not finite or whose smoothed loss is more than `BLOW_UP` x the lowest
    smoothed loss so far (the last step when neither happens)."""
    best, average = math.inf, 0.0
    for step, loss in enumerate(losses):
        if not math.isfinite(loss):
            return step
        average = SMOOTHING * average + (1 - SMOOTHING) * loss
        smoothed = average / (1 - SMOOTHING ** (step + 1))
        if smoothed > BLOW_UP * best:
            return step
        if step >= MIN_AVERAGED - 1:
            best = min(best, smoothed)
    return max(0, len(losses) - 1)


def suggested_rate(losses: Sequence[float], steps: int) -> float:
    """The rate where the test's loss blew up over `BLOW_UP_DIVISOR` (two significant digits), from its
    per-step training losses over its `steps` steps."""
    rate = ramp(blow_up_step(losses), steps) / BLOW_UP_DIVISOR
    return float(f"{rate:.2g}")


class RangeRamp(TrainerCallback):
    """Sets every parameter group's rate before each step."""

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def on_step_begin(self, args: Any, state: Any, control: Any, optimizer: Any = None, **kw: Any) -> None:
        for group in optimizer.param_groups:
            group["lr"] = ramp(state.global_step, self.steps)
