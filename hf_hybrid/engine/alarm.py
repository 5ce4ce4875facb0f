"""Something that went wrong in a step, in one shape for every checker.

Every checker returns `Alarm`s (a level and a reason); `recovery` maps a step's alarms to the one action
the engine performs, so no checker's own shape of "went wrong" leaks past it.
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
    """One thing that went wrong. `blames_weights=False`: says nothing about the parameters (never a
    rollback); `restorable`: a spike a restore can undo; `skips_step`: the update must not be applied;
    `takes_back`: it was applied before being judged (skipping puts them back); `spike`: the guard's;
    `replaces_batch`: the step's batch is to blame, so a clean recent batch may train in its place;
    `scales_back`: a take-back keeps the update at the last kept update's rate."""

    level: DivergenceLevel
    reason: str
    blames_weights: bool = True
    restorable: bool = False
    skips_step: bool = False
    takes_back: bool = False
    spike: bool = False
    replaces_batch: bool = False
    scales_back: bool = False


def worst_level(alarms: Iterable[Alarm]) -> DivergenceLevel:
    return max((a.level for a in alarms), default=DivergenceLevel.NORMAL)


def nonfinite_step(loss: float | None, grad_norm: float | None) -> Alarm | None:
    """A real step whose loss or gradient norm is missing or not finite: its gradient is unusable."""
    if loss is not None and math.isfinite(loss) and (grad_norm is None or math.isfinite(grad_norm)):
        return None
    return Alarm(DivergenceLevel.CRITICAL, f"{NONFINITE_STEP} ({loss}, {grad_norm})", skips_step=True)
