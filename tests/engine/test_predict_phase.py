"""Predict phases (`predict_phase.py`): their verdict, how they end (rolled back, abandoned, completed),
and what a CAUTION does to the rest of one and to later horizons."""

from __future__ import annotations

import dataclasses
import math

import pytest
from engine_loop import (
    Loop,
    ScriptedMonitor,
    clone,
    engine_config,
    equal,
    finite,
    mid_phase_with_moved_params,
    no_rollback,
    scripted_loop,
)

from hf_hybrid.engine.divergence import DivergenceLevel, DivergenceMonitor
from hf_hybrid.engine.phases import Phase
from hf_hybrid.engine.predict_phase import REL_NOISE_FLOOR, PredictPhase, reference_level
from hf_hybrid.engine.recovery import RecoveryAction


def test_regression_at_an_intermediate_correct_step_ends_the_phase() -> None:
    """Rollback at a CORRECT step that does not close the phase must not leave it half open."""
    loop = Loop(engine_config(check_every=0, min_predict_steps=8, max_predict_steps=8, correction_interval=2))
    # only the regression check may react here: silence the z-score signals
    loop.engine.monitor = DivergenceMonitor(min_history=10**6)
    loop.run_until(
        lambda lp: (
            lp.engine.controller.phase is Phase.PREDICT and lp.engine.controller.predicted_since_correct == 2
        )
    )
    assert loop.engine.controller.predict_remaining > 0  # the next CORRECT does not close the phase
    snapshot = clone(loop.engine.guard.snapshot)  # taken when the phase opened
    assert not equal(snapshot, loop.params)  # its predicted steps moved the weights
    record = loop.step(loss_override=1e3)
    assert record.plan.phase is Phase.CORRECT
    assert record.outcome.rolled_back
    assert record.optimizer_calls == 1  # the real step ran, then was undone with the phase
    assert equal(loop.params, snapshot)  # bit-exact: where the phase began
    assert loop.engine.stats()["rollbacks"] == 1
    assert not loop.engine.controller.in_predict_phase
    assert loop.engine.phase is None
    loop.run(3)
    assert loop.phases(-3) == [Phase.FULL] * 3
    loop.run(30)
    assert loop.phases(-30).count(Phase.PREDICT) > 0
    assert all(finite(r.after) for r in loop.records)


class TestWithoutRollback:
    """`rollback=False`: an alarm in an open phase ends it as failed and forces FULL, keeping the weights."""

    def test_a_critical_predict_step_abandons_the_phase_and_keeps_the_weights(self) -> None:
        loop = Loop(no_rollback(engine_config()))
        loop.run_until(mid_phase_with_moved_params)
        snapshot = clone(loop.engine.guard.snapshot)
        cap = loop.engine.controller.horizon_cap
        forced = loop.engine.stats()["forced_full"]
        record = loop.step(loss_override=math.nan)
        assert record.plan.phase is Phase.PREDICT
        assert record.outcome.level is DivergenceLevel.CRITICAL
        assert record.outcome.action is RecoveryAction.FORCE_FULL
        assert not record.outcome.rolled_back and not record.outcome.applied_update
        assert equal(record.after, record.before)  # nothing applied, nothing restored
        assert not equal(loop.params, snapshot)  # the phase's predicted updates stay
        engine = loop.engine
        assert engine.phase is None and not engine.guard.has_snapshot  # ended, its snapshot freed
        assert not engine.controller.in_predict_phase and engine.controller.predict_remaining == 0
        assert engine.stats()["rollbacks"] == 0 and engine.stats()["forced_full"] == forced + 1
        assert engine.controller.horizon_cap == max(2, cap // 2)  # a failed phase halves later horizons
        loop.run(3)
        assert loop.phases(-3) == [Phase.FULL] * 3

    def test_a_regressed_correct_step_keeps_its_real_update(self) -> None:
        loop, _ = scripted_loop(
            no_rollback(engine_config(check_every=0, min_predict_steps=4, max_predict_steps=4))
        )
        loop.run_until(
            lambda lp: (
                lp.engine.controller.phase is Phase.PREDICT and lp.engine.controller.predict_remaining == 0
            )
        )
        snapshot = clone(loop.engine.guard.snapshot)
        record = loop.step(loss_override=1e3)  # the closing CORRECT step: the loss regressed
        assert record.plan.phase is Phase.CORRECT
        assert record.outcome.action is RecoveryAction.FORCE_FULL and not record.outcome.rolled_back
        assert any("regressed" in reason for reason in record.outcome.reasons)
        assert record.optimizer_calls == 1 and record.outcome.applied_update
        assert not equal(record.after, record.before) and not equal(record.after, snapshot)
        assert loop.engine.phase is None and not loop.engine.guard.has_snapshot
        assert loop.engine.stats()["rollbacks"] == 0
        loop.run(3)
        assert loop.phases(-3) == [Phase.FULL] * 3


class TestCaution:
    """A CAUTION halves the rest of the open phase and the cap on later horizons; a phase whose closing
    CORRECT step raised one completes, but keeps the halved cap instead of widening it again."""

    @staticmethod
    def _loop() -> tuple[Loop, ScriptedMonitor]:
        # no bandit: every phase's horizon is the cap, so the cap is what the phases show
        config = dataclasses.replace(
            engine_config(min_predict_steps=2, max_predict_steps=8), use_bandit=False
        )
        return scripted_loop(config)

    @staticmethod
    def _predict_runs(phases: list[Phase]) -> list[int]:
        """Lengths of the runs of PREDICT steps, in order."""
        runs, current = [], 0
        for phase in phases:
            if phase is Phase.PREDICT:
                current += 1
            elif current:
                runs.append(current)
                current = 0
        return runs + ([current] if current else [])

    def test_a_caution_mid_phase_halves_the_rest_of_it(self) -> None:
        loop, monitor = self._loop()
        loop.run_until(
            lambda lp: (
                lp.engine.controller.phase is Phase.PREDICT
                and lp.engine.controller.predicted_since_correct == 2
            )
        )
        start = len(loop.records)
        assert loop.engine.controller.predict_remaining == 6 and loop.engine.controller.horizon_cap == 8
        monitor.next_level = DivergenceLevel.CAUTION
        record = loop.step()  # the third of eight predicted steps
        assert record.plan.phase is Phase.PREDICT and record.outcome.level is DivergenceLevel.CAUTION
        assert record.outcome.action is RecoveryAction.SHORTEN_HORIZON
        assert record.outcome.applied_update and not record.outcome.rolled_back  # a caution applies the step
        assert loop.engine.controller.predict_remaining == 5 // 2
        assert loop.engine.controller.horizon_cap == 4
        loop.run(3)
        assert loop.phases(start) == [Phase.PREDICT] * 3 + [Phase.CORRECT]  # 3 + 2 + 1 == 6 steps, not 8 + 1
        assert not loop.records[-1].outcome.rolled_back
        assert loop.engine.controller.horizon_cap == 8  # the phase held: the cap grows back

    def test_a_caution_at_the_closing_correct_step_keeps_the_halved_cap(self) -> None:
        runs = {}
        for caution in (False, True):
            loop, monitor = self._loop()
            loop.run_until(
                lambda lp: (
                    lp.engine.controller.phase is Phase.PREDICT
                    and lp.engine.controller.predict_remaining == 0
                )
            )
            assert loop.engine.controller.horizon_cap == 8
            first_phase_end = len(loop.records)
            monitor.next_level = DivergenceLevel.CAUTION if caution else None
            record = loop.step()
            assert record.plan.phase is Phase.CORRECT
            assert record.outcome.action is (
                RecoveryAction.SHORTEN_HORIZON if caution else RecoveryAction.CONTINUE
            )
            assert not record.outcome.rolled_back and loop.engine.phase is None  # completed, not failed
            assert loop.engine.controller.horizon_cap == (4 if caution else 8)
            loop.run(20)
            runs[caution] = self._predict_runs(loop.phases(first_phase_end))
        assert runs[False][0] == 8 and runs[True][0] == 4  # the next phase's horizon


def test_reference_level_is_the_forecast_and_the_noise_of_recent_full_losses() -> None:
    full = [1.0, 1.1, 1.0, 1.2, 1.0]  # step-to-step changes 0.1, 0.1, 0.2, 0.2: median 0.2
    mean, std = reference_level(lambda: 0.9, full)
    assert mean == 0.9 and std == pytest.approx(0.2 / 0.954)
    assert reference_level(lambda: 0.9, full[:4]) is None  # too few losses: the caller falls back
    assert reference_level(lambda: None, full) is None  # no forecast
    assert reference_level(lambda: 2.0, [1.0] * 6) == (2.0, REL_NOISE_FLOOR * 2.0)  # flat: the floor


def test_a_phase_regressed_when_its_mean_loss_rose_past_the_noise_of_its_measurements() -> None:
    phase = PredictPhase(opened_at=10, horizon=4, reference_loss=1.0, reference_noise=0.1)
    assert not phase.regressed(1.19, sigma=2.0) and phase.regressed(1.21, sigma=2.0)  # one loss: 1 + 2 * 0.1
    for loss in (1.19, 1.19):
        phase.record_predicted(loss)
    assert phase.regressed(1.19, sigma=2.0)  # three losses: 1 + 2 * 0.1 / sqrt(3)
    assert phase.regressed(None, sigma=2.0) and phase.regressed(math.nan, sigma=2.0)
    assert phase.predicted == 2 and PredictPhase.from_state(phase.state_dict()) == phase


def test_with_a_probe_a_phase_holds_while_the_probe_loss_falls() -> None:
    phase = PredictPhase(opened_at=10, horizon=4, reference_loss=1.0, reference_noise=0.1, probe_before=1.0)
    assert phase.verdict(5.0, lambda: 0.9, sigma=2.0) is None  # the training loss is not what is judged
    assert phase.probe_before == 0.9  # the next stretch starts from here
    alarm = phase.verdict(0.5, lambda: 0.95, sigma=2.0)
    assert alarm.level is DivergenceLevel.WARNING and "probe loss did not fall" in alarm.reason
