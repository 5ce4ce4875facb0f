"""One recovery policy: from everything that went wrong in a step to the one action the engine performs.

Every source of trouble reports an `Alarm` (`alarm.py`); `choose_action` maps a step's alarms to one
`RecoveryAction`, which the engine performs and logs exactly, so the log cannot disagree with it.

    no alarm / NORMAL    -> CONTINUE
    CAUTION              -> SHORTEN_HORIZON (halve the rest of the phase and the horizon cap)
    WARNING or CRITICAL  -> ROLLBACK: a predict phase is open, an alarm blames its weights, a snapshot exists;
                            RESTORE: no phase is open, a loss spike, and the spike guard can restore;
                            SKIP: an alarm says the update must not be applied (a non-finite gradient,
                            a spike blamed on the batch, whose step then trains on a kept clean batch
                            where the guard has one; applied already: taken back);
                            FORCE_FULL otherwise (an open phase ends as failed, weights untouched).
Every action but CONTINUE and SHORTEN_HORIZON then forces `full_steps` FULL steps. Whether a real step's
update is applied at all is `applies_update`, read off the same alarms before the optimizer runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from enum import Enum

from .alarm import NONFINITE_STEP, Alarm, DivergenceLevel, worst_level

__all__ = [
    "NONFINITE_STEP",
    "Alarm",
    "RecoveryAction",
    "applies_update",
    "choose_action",
    "describe",
    "worst_level",
]


class RecoveryAction(str, Enum):
    """What the engine did about a step, in increasing severity."""

    CONTINUE = "continue"
    SHORTEN_HORIZON = "shorten_horizon"
    SKIP = "skip"
    FORCE_FULL = "force_full"
    ROLLBACK = "rollback"
    RESTORE = "restore"


def choose_action(
    alarms: Iterable[Alarm],
    *,
    phase_open: bool,
    can_roll_back: bool,
    can_restore: Callable[[], bool] = lambda: False,
) -> RecoveryAction:
    """The single rule table above; `can_restore()` is asked only for a spike."""
    alarms = list(alarms)
    level = worst_level(alarms)
    if level >= DivergenceLevel.WARNING:
        blamed = any(a.blames_weights for a in alarms if a.level >= DivergenceLevel.WARNING)
        if phase_open and blamed and can_roll_back:
            return RecoveryAction.ROLLBACK
        if not phase_open and any(a.restorable for a in alarms) and can_restore():
            return RecoveryAction.RESTORE
        if not applies_update(alarms):
            return RecoveryAction.SKIP
        return RecoveryAction.FORCE_FULL
    if level is DivergenceLevel.CAUTION:
        return RecoveryAction.SHORTEN_HORIZON
    return RecoveryAction.CONTINUE


def applies_update(alarms: Iterable[Alarm]) -> bool:
    """Whether a real step's update may reach the weights: not when any alarm skips the step."""
    return not any(a.skips_step for a in alarms)


def describe(
    action: RecoveryAction,
    alarms: Iterable[Alarm],
    full_steps: int,
    ended_phase: bool,
    replayed: int | None = None,
) -> tuple[str, bool]:
    """The log line's account of what was done, and whether it deserves a WARNING (else INFO);
    `replayed`: the step whose clean batches a skipped step trained on instead."""
    alarms = list(alarms)
    full = f"{full_steps} FULL steps"
    done = {
        RecoveryAction.CONTINUE: "carried on",
        RecoveryAction.ROLLBACK: f"rolled back to the start of the predict phase, then {full}",
        RecoveryAction.RESTORE: f"restored the spike guard's copy from before the spike, then {full}",
        RecoveryAction.SKIP: f"skipped the optimizer step (weights, optimizer state unchanged), then {full}",
        RecoveryAction.FORCE_FULL: f"ended the predict phase, then {full}"
        if ended_phase
        else f"{full} before the next predict phase",
        RecoveryAction.SHORTEN_HORIZON: "halved the predict horizon",
    }[action]
    if action is RecoveryAction.SKIP and any(a.scales_back for a in alarms):
        done = f"kept the applied update at the last kept update's learning rate, then {full}"
    elif action is RecoveryAction.SKIP and any(a.takes_back for a in alarms):
        done = f"took the applied update back (weights as before the step), then {full}"
    elif action is RecoveryAction.SKIP and replayed is not None:
        done = f"skipped the batch, trained the step on the clean batches of step {replayed}, then {full}"
    skipped = not applies_update(alarms)
    if skipped and action is not RecoveryAction.SKIP:
        done = "skipped the optimizer step; " + done
    notable = (
        action in (RecoveryAction.ROLLBACK, RecoveryAction.RESTORE)
        or (action is RecoveryAction.FORCE_FULL and ended_phase)
        or skipped
    )
    return "; ".join(a.reason for a in alarms) + f" -> {done}", notable
