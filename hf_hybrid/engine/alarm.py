"""Something that went wrong in a step, in one shape for every checker.

The divergence monitor, a predict phase's verdict, the update watch's predictor and the guard each return
`Alarm`s (a level and a reason); the engine gathers a step's alarms as they are and `recovery` maps them
to the one action it performs, so no checker's own shape of "went wrong" leaks past it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum

NONFINITE_STEP = "non-finite loss/grad norm"  # the reason of a real step that is not applied


class DivergenceLevel(IntEnum):
    """How far from normal one step looks; ordered, so the worst signal is ``max``."""

    NORMAL = 0
    CAUTION = 1
    WARNING = 2
    CRITICAL = 3


@dataclass(frozen=True)
class Alarm:
    """One thing that went wrong. `blames_weights=False` for failures that say nothing about the
    parameters (a predictor that crashed while only being scored): they never cause a rollback.
    `restorable`: a loss spike the spike guard can undo by restoring a copy from before it;
    `skips_step`: the step's update must not be applied (a non-finite gradient, or a spike blamed on the
    batch); `takes_back`: that update was applied before it was judged (the spike guard's update check),
    so skipping it puts back the weights of before the step; `spike`: raised by the spike guard (its skips
    are counted as the guard's)."""

    level: DivergenceLevel
    reason: str
    blames_weights: bool = True
    restorable: bool = False
    skips_step: bool = False
    takes_back: bool = False
    spike: bool = False


def worst_level(alarms: Iterable[Alarm]) -> DivergenceLevel:
    return max((a.level for a in alarms), default=DivergenceLevel.NORMAL)


def nonfinite_step(loss: float | None, grad_norm: float | None) -> Alarm | None:
    """A real step whose loss or gradient norm is missing or not finite: its gradient is unusable."""
    if loss is not None and math.isfinite(loss) and (grad_norm is None or math.isfinite(grad_norm)):
        return None
    return Alarm(DivergenceLevel.CRITICAL, f"{NONFINITE_STEP} ({loss}, {grad_norm})", skips_step=True)
