"""What travels between the caller and the engine in one optimizer step.

`HybridEngine.begin_step` returns a `StepPlan`; the caller measures a `StepRecord` and hands it to
`finish_step`, which returns the `StepOutcome`: all the caller needs to know about the step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .alarm import Alarm, DivergenceLevel, worst_level
from .phases import Phase
from .recovery import RecoveryAction


@dataclass(frozen=True)
class StepPlan:
    """What the caller runs in the step: the phase, whether to measure its loss, else the last one."""

    phase: Phase
    measure_loss: bool
    carried_loss: float | None = None


@dataclass(frozen=True)
class StepRecord:
    """What the caller measured in one optimizer step (the loss averaged over ranks; None: not measured)."""

    loss: float | None
    grad_norm: float | None
    learning_rate: float


@dataclass(frozen=True)
class StepOutcome:
    """What the step did: phase, loss, update applied or rolled back, its alarms and the action taken."""

    phase: Phase
    loss: float | None
    applied_update: bool
    rolled_back: bool
    level: DivergenceLevel
    reasons: tuple[str, ...] = ()
    action: RecoveryAction = RecoveryAction.CONTINUE
    predicted_loss: float | None = None  # the loss forecaster's guess for this step, when awake

    @classmethod
    def of(
        cls,
        phase: Phase,
        loss: float | None,
        applied: bool,
        alarms: Sequence[Alarm],
        action: RecoveryAction,
        predicted_loss: float | None,
    ) -> StepOutcome:
        return cls(
            phase,
            loss,
            applied,
            action is RecoveryAction.ROLLBACK,
            worst_level(alarms),
            tuple(a.reason for a in alarms),
            action,
            predicted_loss,
        )
