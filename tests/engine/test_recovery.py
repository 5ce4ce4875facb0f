"""The one recovery policy: alarms -> action (the engine performs exactly what this returns)."""

from __future__ import annotations

import pytest

from hf_hybrid.engine.divergence import DivergenceLevel
from hf_hybrid.engine.recovery import Alarm, RecoveryAction, choose_action, worst_level

N, C, W, X = (
    DivergenceLevel.NORMAL,
    DivergenceLevel.CAUTION,
    DivergenceLevel.WARNING,
    DivergenceLevel.CRITICAL,
)


@pytest.mark.parametrize(
    ("levels", "phase_open", "can_roll_back", "expected"),
    [
        ((), True, True, RecoveryAction.CONTINUE),
        ((C,), True, True, RecoveryAction.SHORTEN_HORIZON),
        ((C,), False, False, RecoveryAction.SHORTEN_HORIZON),
        ((W,), True, True, RecoveryAction.ROLLBACK),
        ((X,), True, True, RecoveryAction.ROLLBACK),
        ((C, X), True, True, RecoveryAction.ROLLBACK),  # the worst alarm decides
        ((W,), False, True, RecoveryAction.FORCE_FULL),  # no open phase: nothing to roll back
        ((X,), False, False, RecoveryAction.FORCE_FULL),
        ((X,), True, False, RecoveryAction.FORCE_FULL),  # rollback disabled, or no snapshot
    ],
)
def test_rule_table(levels, phase_open, can_roll_back, expected) -> None:
    alarms = [Alarm(level, f"reason {i}") for i, level in enumerate(levels)]
    assert choose_action(alarms, phase_open=phase_open, can_roll_back=can_roll_back) is expected


def test_an_alarm_that_does_not_blame_the_weights_never_rolls_back() -> None:
    scoring_failed = Alarm(W, "the predictor failed (RuntimeError)", blames_weights=False)
    assert choose_action([scoring_failed], phase_open=True, can_roll_back=True) is RecoveryAction.FORCE_FULL
    spike = Alarm(X, "loss z-score 9.0 > 6.0")
    assert (
        choose_action([scoring_failed, spike], phase_open=True, can_roll_back=True) is RecoveryAction.ROLLBACK
    )


def test_a_caution_that_blames_the_weights_does_not_turn_a_warning_into_a_rollback() -> None:
    alarms = [Alarm(C, "loss z-score 3.5 > 3.0"), Alarm(W, "predictor failed", blames_weights=False)]
    assert choose_action(alarms, phase_open=True, can_roll_back=True) is RecoveryAction.FORCE_FULL


def test_the_worst_alarm_is_the_level() -> None:
    alarms = [Alarm(C, "loss z-score 3.5 > 3.0"), Alarm(W, "grad norm ratio 12.0 > 10.0")]
    assert worst_level(alarms) is W and worst_level([]) is N
