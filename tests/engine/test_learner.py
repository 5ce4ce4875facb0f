"""The predictor's side of a step (`learner.py`), through the engine: a guess that raises, is not finite or
is huge is refused, scored as no guess, or held to the trust region, and its predictors start over."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator

import pytest
import torch
from engine_loop import (
    Loop,
    Record,
    clone,
    engine_config,
    equal,
    finite,
    mid_phase_with_moved_params,
)

from hf_hybrid.engine.divergence import DivergenceLevel
from hf_hybrid.engine.phases import Phase
from hf_hybrid.engine.predictor import Deltas, EMAPredictor, register_predictor, unregister_predictor
from hf_hybrid.engine.recovery import RecoveryAction


class _FaultyPredictor(EMAPredictor):
    """EMA predictor that misbehaves once `armed` (set by the test, on the next predict step)."""

    name = "test-faulty"
    armed = False
    resets = 0

    def fault(self, steps_ahead: int) -> Deltas | None:
        raise NotImplementedError

    def predict(self, steps_ahead: int) -> Deltas | None:
        if self.armed:
            return self.fault(steps_ahead)
        return super().predict(steps_ahead)

    def reset(self) -> None:
        type(self).resets += 1
        super().reset()


class _NaNPredictor(_FaultyPredictor):
    name = "test-nan"

    def fault(self, steps_ahead: int) -> Deltas | None:
        out = EMAPredictor.predict(self, steps_ahead)
        assert out is not None
        name = sorted(out)[-1]
        out[name] = out[name].clone()
        out[name].view(-1)[0] = math.nan
        return out


class _RaisingPredictor(_FaultyPredictor):
    name = "test-raising"

    def fault(self, steps_ahead: int) -> Deltas | None:
        raise RuntimeError("predictor blew up")


class _HugePredictor(EMAPredictor):
    name = "test-huge"

    def predict(self, steps_ahead: int) -> Deltas | None:
        out = super().predict(steps_ahead)
        return None if out is None else {n: torch.sign(t) * 1e30 + 1e29 for n, t in out.items()}


@pytest.fixture
def faulty_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    classes = (_NaNPredictor, _RaisingPredictor, _HugePredictor)
    for cls in classes:
        register_predictor(cls.name, cls)
        if issubclass(cls, _FaultyPredictor):
            monkeypatch.setattr(cls, "armed", False)
            monkeypatch.setattr(cls, "resets", 0)
    yield
    for cls in classes:
        unregister_predictor(cls.name)


def _faulty_step_mid_phase(loop: Loop) -> tuple[_FaultyPredictor, dict[str, torch.Tensor], Record]:
    """Run to a predict phase that has moved the weights, then one step whose prediction fails: the
    predictor, the phase's snapshot and that step's record."""
    predictor = loop.engine.predictor
    assert isinstance(predictor, _FaultyPredictor)
    loop.run_until(mid_phase_with_moved_params)
    snapshot = clone(loop.engine.guard.snapshot)
    predictor.armed = True
    record = loop.step()
    predictor.armed = False
    assert record.plan.phase is Phase.PREDICT
    return predictor, snapshot, record


@pytest.mark.usefixtures("faulty_registry")
class TestFaultyPredictors:
    @pytest.mark.parametrize("name", ["test-nan", "test-raising"])
    def test_bad_prediction_mid_phase_rolls_back_and_forces_full(self, name: str) -> None:
        loop = Loop(engine_config(predictor=name, check_every=0))
        predictor, snapshot, record = _faulty_step_mid_phase(loop)
        assert not record.outcome.applied_update
        assert record.optimizer_calls == 0
        assert equal(loop.params, snapshot)  # rolled back to the start of the phase
        assert finite(loop.params)
        stats = loop.engine.stats()
        assert stats["refused_updates"] == 1
        assert stats["predictor_errors"] == (1 if name == "test-raising" else 0)
        assert type(predictor).resets >= 1 and predictor.observed == 0
        assert not loop.engine.guard.has_snapshot  # the phase is closed, its snapshot freed
        assert loop.engine.phase is None
        loop.run(3)
        assert loop.phases(-3) == [Phase.FULL] * 3
        # after the reset the predictor needs min_history real updates again before a new phase
        loop.run(12)
        assert all(finite(r.after) for r in loop.records)

    @pytest.mark.parametrize("rollback", [True, False], ids=["rollback", "no_rollback"])
    def test_refused_or_rolled_back_predict_steps(self, rollback: bool) -> None:
        """A refused guess writes nothing: the weights stay those the step began with (rollback off) or
        go back to the phase's snapshot (rollback on), whichever the refusal led to."""
        loop = Loop(
            dataclasses.replace(engine_config(predictor="test-nan", check_every=0), rollback=rollback)
        )
        predictor, snapshot, record = _faulty_step_mid_phase(loop)
        assert loop.engine.stats()["refused_updates"] == 1  # the refusal happened, at this step
        assert any("non-finite" in reason for reason in record.outcome.reasons)
        assert not record.outcome.applied_update
        assert record.outcome.rolled_back is rollback
        assert not equal(record.before, snapshot)  # so the two outcomes below are told apart
        assert equal(record.after, snapshot if rollback else record.before)

    def test_raising_in_real_step_is_harmless(self) -> None:
        loop = Loop(engine_config(predictor="test-raising"))
        loop.run(12)
        scorer = loop.engine.watch.scorer  # a real step's guess is asked of the twin on the sample
        assert isinstance(scorer, _FaultyPredictor)
        scorer.armed = True
        record = loop.step()
        scorer.armed = False
        assert record.plan.phase is Phase.FULL
        assert record.optimizer_calls == 1 and record.outcome.applied_update
        assert loop.engine.stats()["predictor_errors"] == 1
        # both predictors reset, then observed this step's real update
        assert scorer.observed == loop.engine.predictor.observed == 1

    def test_huge_deltas_are_held_to_the_trust_region(self) -> None:
        loop = Loop(engine_config(predictor="test-huge", check_every=0))
        loop.run(60)
        max_delta = loop.engine.config.max_delta
        applied = [r for r in loop.records if r.plan.phase is Phase.PREDICT and r.outcome.applied_update]
        assert applied
        for r in applied:
            for name, before in r.before.items():
                change = r.after[name] - before
                rms = before.pow(2).mean().sqrt()
                cap = before.abs().clamp_min(rms) * max_delta
                assert bool((change.abs() <= cap * (1 + 1e-5) + 1e-7).all()), name
                assert float(change.norm()) <= max_delta * float(before.norm()) * (1 + 1e-5) + 1e-7
        assert loop.engine.stats()["clipped_tensors"] >= len(applied)
        assert all(finite(r.after) for r in loop.records)


@pytest.mark.usefixtures("faulty_registry")
def test_a_predictor_failing_at_an_intermediate_correct_step_ends_the_phase_without_rollback() -> None:
    """The guess scored at a CORRECT step that does not close the phase raises: the predictor is reset,
    so the phase cannot go on; the weights are not to blame, so its real step stands (no rollback, although
    rollback is on and a snapshot exists) and FULL steps follow."""
    loop = Loop(
        engine_config(
            predictor="test-raising",
            check_every=0,
            min_predict_steps=8,
            max_predict_steps=8,
            correction_interval=2,
        )
    )
    predictor = loop.engine.predictor
    assert isinstance(predictor, _FaultyPredictor)
    loop.run_until(
        lambda lp: (
            lp.engine.controller.phase is Phase.PREDICT and lp.engine.controller.predicted_since_correct == 2
        )
    )
    assert loop.engine.controller.predict_remaining > 0 and loop.engine.guard.has_snapshot
    snapshot = clone(loop.engine.guard.snapshot)
    errors, resets = loop.engine.stats()["predictor_errors"], type(predictor).resets
    type(predictor).armed = True  # whichever instance of it the engine consults (the fixture restores it)
    record = loop.step()
    type(predictor).armed = False
    assert record.plan.phase is Phase.CORRECT
    assert record.outcome.reasons == ("the predictor failed (RuntimeError)",)
    assert record.outcome.level is DivergenceLevel.WARNING
    assert record.outcome.action is RecoveryAction.FORCE_FULL and not record.outcome.rolled_back
    assert record.optimizer_calls == 1 and record.outcome.applied_update
    assert not equal(record.after, snapshot)  # the real step's weights stand
    stats = loop.engine.stats()
    assert stats["predictor_errors"] == errors + 1 and stats["rollbacks"] == 0
    assert type(predictor).resets > resets
    assert loop.engine.phase is None and not loop.engine.controller.in_predict_phase
    loop.run(3)
    assert loop.phases(-3) == [Phase.FULL] * 3
