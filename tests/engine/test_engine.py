"""HybridEngine end to end, driven by a plain PyTorch training loop (`engine_loop.py`, no transformers).

The parts have their own files: test_learner.py, test_predict_phase.py, test_wakefulness.py, test_watch.py,
test_loss_watch.py, test_parts.py (the engine's state)."""

from __future__ import annotations

import math

import pytest
import torch
from engine_loop import (
    LR,
    Loop,
    clone,
    engine_config,
    equal,
    finite,
    mid_phase_with_moved_params,
)
from torch import nn

from hf_hybrid.engine.divergence import DivergenceLevel
from hf_hybrid.engine.engine import EngineConfig, HybridEngine, StepRecord
from hf_hybrid.engine.phases import Phase


@pytest.fixture(scope="module")
def full_run() -> Loop:
    loop = Loop(engine_config())
    loop.run(200)
    return loop


class TestFullRun:
    def test_every_phase_occurs(self, full_run: Loop) -> None:
        phases = full_run.phases()
        assert phases[:10] == [Phase.WARMUP] * 10
        assert Phase.WARMUP not in phases[10:]
        assert phases[10:13] == [Phase.FULL] * 3
        assert {Phase.FULL, Phase.PREDICT, Phase.CORRECT} <= set(phases[10:])

    def test_counts_add_up(self, full_run: Loop) -> None:
        stats = full_run.engine.stats()
        phases = full_run.phases()
        assert stats["steps"] == 200 == sum(stats["steps_per_phase"].values())
        assert stats["steps_per_phase"] == {p.value: phases.count(p) for p in Phase}
        assert stats["backward_run"] + stats["backward_skipped"] == 200
        assert stats["backward_skipped"] == phases.count(Phase.PREDICT) > 0
        assert stats["backward_run"] == full_run.optimizer_calls
        assert stats["predict_checked"] + stats["predict_blind"] == stats["backward_skipped"]
        assert stats["predict_phases"] >= 2
        assert 0.0 < stats["backward_skipped_fraction"] < 1.0
        assert 0.0 < stats["compute_saved_fraction"] < stats["backward_skipped_fraction"]
        # the full-size predictor; its twin on the sample, which scores the guesses, counts in the engine
        watch = full_run.engine.watch
        assert stats["predictor_bytes"] == watch.predictor.nbytes()
        assert stats["engine_peak_bytes"] >= watch.predictor.nbytes() + watch.scorer.nbytes()
        assert watch.predictor.nbytes() >= watch.scorer.nbytes() > 0  # this small model: all of it

    def test_phase_sequence_is_a_valid_cycle(self, full_run: Loop) -> None:
        phases = full_run.phases()
        # the checks below are about PREDICT and CORRECT steps: the run must have both
        assert phases.count(Phase.PREDICT) >= 5 and phases.count(Phase.CORRECT) >= 2
        for prev, cur in zip(phases[:-1], phases[1:], strict=True):
            if cur is Phase.CORRECT:
                assert prev is Phase.PREDICT
            if cur is Phase.PREDICT:
                assert prev in (Phase.FULL, Phase.PREDICT)

    def test_predict_steps_never_call_the_optimizer(self, full_run: Loop) -> None:
        assert full_run.optimizer_calls_in_predict == 0
        for r in full_run.records:
            assert r.optimizer_calls == (0 if r.plan.phase is Phase.PREDICT else 1)

    def test_predict_steps_leave_optimizer_state_alone(self, full_run: Loop) -> None:
        predict = [r for r in full_run.records if r.plan.phase is Phase.PREDICT]
        assert predict and all(r.optimizer_state_unchanged for r in predict)

    def test_applied_predict_steps_move_params_by_exactly_the_guarded_delta(self, full_run: Loop) -> None:
        applied = [r for r in full_run.records if r.plan.phase is Phase.PREDICT and r.outcome.applied_update]
        assert len(applied) >= 5
        for r in applied:
            assert r.expected_delta is not None
            for name, before in r.before.items():
                assert torch.equal(r.after[name], before + r.expected_delta[name]), name
            assert any(not torch.equal(r.after[n], r.before[n]) for n in r.before)

    def test_weights_always_finite_and_loss_falls(self, full_run: Loop) -> None:
        assert all(finite(r.after) for r in full_run.records)
        losses = [r.outcome.loss for r in full_run.records if r.plan.phase.runs_backward]
        assert losses[-1] < 0.5 * losses[0]

    def test_metrics_are_finite_floats(self, full_run: Loop) -> None:
        metrics = full_run.engine.metrics()
        assert all(isinstance(v, float) and math.isfinite(v) for v in metrics.values())
        assert 0.0 <= metrics["confidence"] <= 1.0
        assert metrics["steps_predict"] == full_run.phases().count(Phase.PREDICT)


class TestValidation:
    def test_needs_parameters(self) -> None:
        with pytest.raises(ValueError, match="at least one trainable parameter"):
            HybridEngine({})

    def test_finish_without_begin(self) -> None:
        loop = Loop(engine_config())
        with pytest.raises(RuntimeError, match="without begin_step"):
            loop.engine.finish_step(StepRecord(1.0, 1.0, LR), loop._optimizer_step)

    def test_unknown_predictor(self) -> None:
        with pytest.raises(ValueError, match=r"`predictor` must be one of \['auto', 'adam', .*got 'nope'"):
            HybridEngine({"w": nn.Parameter(torch.ones(2))}, EngineConfig(predictor="nope"))


class TestNullPredictor:
    def test_applies_nothing(self) -> None:
        # blind steps: on this noise-free full-batch problem a measured, un-updated step is (rightly)
        # flagged as worse than the loss model's forecast, which would cut every phase short
        loop = Loop(engine_config(predictor="null", check_every=0))
        loop.run(60)
        predict = [r for r in loop.records if r.plan.phase is Phase.PREDICT]
        assert len(predict) >= 5
        for r in predict:
            assert not r.outcome.applied_update
            assert equal(r.before, r.after)
        assert loop.engine.stats()["clipped_tensors"] == 0
        assert loop.engine.stats()["refused_updates"] == 0


class TestInjectedLosses:
    @pytest.mark.parametrize("bad_loss", [math.nan, math.inf])
    def test_non_finite_loss_in_predict_step_rolls_back(self, bad_loss: float) -> None:
        loop = Loop(engine_config())
        loop.run_until(mid_phase_with_moved_params)
        snapshot = clone(loop.engine.guard.snapshot)
        rollbacks = loop.engine.stats()["rollbacks"]
        record = loop.step(loss_override=bad_loss)
        assert record.plan.phase is Phase.PREDICT
        assert record.outcome.rolled_back and not record.outcome.applied_update
        assert record.outcome.level is DivergenceLevel.CRITICAL
        assert equal(loop.params, snapshot)  # bit-exact
        assert finite(loop.params)
        assert loop.engine.stats()["rollbacks"] == rollbacks + 1
        assert not loop.engine.guard.has_snapshot
        for name, p in loop.params.items():
            assert torch.equal(loop.engine.watch.updates.last[name], p.detach().float())
        loop.run(3)
        assert loop.phases(-3) == [Phase.FULL] * 3
        assert all(finite(r.after) for r in loop.records)

    def test_loss_spike_in_predict_step_rolls_back_and_forces_full(self) -> None:
        loop = Loop(engine_config())
        loop.run_until(mid_phase_with_moved_params)
        snapshot = clone(loop.engine.guard.snapshot)
        last_loss = loop.engine.losses.measured
        assert last_loss is not None
        record = loop.step(loss_override=50.0 * last_loss)
        assert record.outcome.rolled_back and record.outcome.level is DivergenceLevel.CRITICAL
        assert any("loss" in reason for reason in record.outcome.reasons)
        assert equal(loop.params, snapshot)
        loop.run(3)
        assert loop.phases(-3) == [Phase.FULL] * 3

    def test_non_finite_loss_in_real_step_skips_the_optimizer(self) -> None:
        loop = Loop(engine_config())
        loop.run(12)
        record = loop.step(loss_override=math.nan)
        assert record.plan.phase is Phase.FULL
        assert record.optimizer_calls == 0
        assert not record.outcome.applied_update
        assert equal(record.before, record.after)
        assert loop.engine.stats()["nonfinite_real_steps"] == 1
        loop.run(3)
        assert loop.phases(-3) == [Phase.FULL] * 3

    def test_non_finite_grad_norm_can_still_call_the_optimizer(self) -> None:
        loop = Loop(engine_config())
        loop.run(12)
        plan = loop.engine.begin_step()
        assert plan.phase is Phase.FULL
        calls = loop.optimizer_calls
        outcome = loop.engine.finish_step(
            StepRecord(1.0, math.inf, LR), loop._optimizer_step, skip_nonfinite_step=False
        )
        assert loop.optimizer_calls == calls + 1
        assert not outcome.applied_update
        assert outcome.level is DivergenceLevel.CRITICAL
