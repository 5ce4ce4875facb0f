"""Tests for HybridEngine, driven by a plain PyTorch training loop (no transformers)."""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from torch import nn

from hf_hybrid.engine.alarm import Alarm
from hf_hybrid.engine.divergence import DivergenceLevel, DivergenceMonitor
from hf_hybrid.engine.engine import EngineConfig, HybridEngine, StepOutcome, StepPlan, StepRecord
from hf_hybrid.engine.guard import clip_to_trust_region
from hf_hybrid.engine.phases import Phase, PhaseSchedule
from hf_hybrid.engine.predictor import Deltas, EMAPredictor, register_predictor, unregister_predictor
from hf_hybrid.engine.recovery import RecoveryAction

LR = 1e-2


def _config(predictor: str = "ema", check_every: int = 1, **schedule: Any) -> EngineConfig:
    kwargs: dict[str, Any] = {"warmup_steps": 10, "full_steps": 3, "confidence_threshold": 0.0}
    kwargs.update(schedule)
    return EngineConfig(schedule=PhaseSchedule(**kwargs), predictor=predictor, check_every=check_every)


def _clone(params: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in params.items()}


def _equal(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[n].detach(), b[n].detach()) for n in a)


def _finite(params: Mapping[str, torch.Tensor]) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in params.values())


def _optimizer_state(opt: torch.optim.Optimizer) -> dict[int, dict[str, Any]]:
    return copy.deepcopy(opt.state_dict()["state"])


def _same_optimizer_state(a: dict[int, dict[str, Any]], b: dict[int, dict[str, Any]]) -> bool:
    if a.keys() != b.keys():
        return False
    for key in a:
        if a[key].keys() != b[key].keys():
            return False
        for name in a[key]:
            x, y = a[key][name], b[key][name]
            if not (torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y):
                return False
    return True


@dataclass
class Record:
    plan: StepPlan
    outcome: StepOutcome
    before: dict[str, torch.Tensor]
    after: dict[str, torch.Tensor]
    optimizer_calls: int
    expected_delta: dict[str, torch.Tensor] | None = None
    optimizer_state_unchanged: bool | None = None


@dataclass
class Loop:
    """A 2-layer MLP regression on fixed random data, trained by AdamW through the engine."""

    config: EngineConfig
    seed: int = 0
    records: list[Record] = field(default_factory=list)
    optimizer_calls: int = 0
    optimizer_calls_in_predict: int = 0

    def __post_init__(self) -> None:
        gen = torch.Generator().manual_seed(self.seed)
        with torch.random.fork_rng():
            torch.manual_seed(self.seed)
            self.model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
        self.x = torch.randn(64, 8, generator=gen)
        self.y = self.x @ torch.randn(8, 1, generator=gen) + 0.1 * torch.randn(64, 1, generator=gen)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=LR)
        self.params = dict(self.model.named_parameters())
        self.engine = HybridEngine(self.params, self.config)
        self._phase: Phase | None = None

    def _optimizer_step(self) -> None:
        self.optimizer_calls += 1
        if self._phase is Phase.PREDICT:
            self.optimizer_calls_in_predict += 1
        self.opt.step()

    def _loss(self) -> torch.Tensor:
        return nn.functional.mse_loss(self.model(self.x), self.y)

    def _expected_predicted_delta(self) -> dict[str, torch.Tensor] | None:
        """What the engine should apply in this predict step, computed independently of the guard."""
        engine = self.engine
        try:
            predicted = engine.predictor.predict(engine.steps_since_real + 1)
        except RuntimeError:  # a faulty test predictor
            return None
        if predicted is None:
            return None
        scale = engine.corrector.scale
        return {
            n: clip_to_trust_region(t * scale, self.params[n], engine.config.max_delta)[0]
            for n, t in predicted.items()
        }

    def step(self, loss_override: float | None = None, grad_norm_override: float | None = None) -> Record:
        plan = self.engine.begin_step()
        self._phase = plan.phase
        before = _clone(self.params)
        calls = self.optimizer_calls
        expected = None
        opt_state = None
        if plan.phase.runs_backward:
            self.opt.zero_grad()
            loss = self._loss()
            loss.backward()
            grad_norm = float(nn.utils.clip_grad_norm_(self.model.parameters(), 1.0))
            value: float | None = loss.item() if loss_override is None else loss_override
            if grad_norm_override is not None:
                grad_norm = grad_norm_override
            outcome = self.engine.finish_step(StepRecord(value, grad_norm, LR), self._optimizer_step)
        else:
            value = None
            if plan.measure_loss:
                with torch.no_grad():
                    value = self._loss().item()
            if loss_override is not None:
                value = loss_override
            expected = self._expected_predicted_delta()
            opt_state = _optimizer_state(self.opt)
            outcome = self.engine.finish_step(StepRecord(value, None, LR), self._optimizer_step)
        record = Record(plan, outcome, before, _clone(self.params), self.optimizer_calls - calls, expected)
        if opt_state is not None:
            record.optimizer_state_unchanged = _same_optimizer_state(opt_state, _optimizer_state(self.opt))
        self.records.append(record)
        return record

    def run(self, steps: int) -> list[Record]:
        return [self.step() for _ in range(steps)]

    def run_until(self, condition: Any, limit: int = 200) -> None:
        """Step until `condition(loop)` holds right after begin_step would be called next."""
        for _ in range(limit):
            if condition(self):
                return
            self.step()
        raise AssertionError("condition never met")

    def phases(self, start: int = 0) -> list[Phase]:
        return [r.plan.phase for r in self.records[start:]]


def _mid_phase_with_moved_params(loop: Loop) -> bool:
    """Last step: an applied PREDICT step; the phase is still open and params differ from its snapshot."""
    if not loop.records:
        return False
    last = loop.records[-1]
    return (
        last.plan.phase is Phase.PREDICT
        and last.outcome.applied_update
        and loop.engine.controller.phase is Phase.PREDICT
        and loop.engine.controller.predict_remaining > 0
        and not _equal(loop.engine.guard.snapshot, loop.params)
    )


@pytest.fixture(scope="module")
def full_run() -> Loop:
    loop = Loop(_config())
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
        assert all(_finite(r.after) for r in full_run.records)
        losses = [r.outcome.loss for r in full_run.records if r.plan.phase.runs_backward]
        assert losses[-1] < 0.5 * losses[0]

    def test_metrics_are_finite_floats(self, full_run: Loop) -> None:
        metrics = full_run.engine.metrics()
        assert all(isinstance(v, float) and math.isfinite(v) for v in metrics.values())
        assert 0.0 <= metrics["confidence"] <= 1.0
        assert metrics["steps_predict"] == full_run.phases().count(Phase.PREDICT)

    def test_update_tracker_follows_the_parameters(self, full_run: Loop) -> None:
        engine = full_run.engine
        assert engine.watch.updates.last.keys() == full_run.params.keys()
        for name, p in full_run.params.items():
            assert torch.equal(engine.watch.updates.last[name], p.detach().float())


class TestValidation:
    def test_needs_parameters(self) -> None:
        with pytest.raises(ValueError, match="at least one trainable parameter"):
            HybridEngine({})

    def test_finish_without_begin(self) -> None:
        loop = Loop(_config())
        with pytest.raises(RuntimeError, match="without begin_step"):
            loop.engine.finish_step(StepRecord(1.0, 1.0, LR), loop._optimizer_step)

    def test_unknown_predictor(self) -> None:
        with pytest.raises(ValueError, match=r"`predictor` must be one of \['auto', 'adam', .*got 'nope'"):
            HybridEngine({"w": nn.Parameter(torch.ones(2))}, EngineConfig(predictor="nope"))


class TestNullPredictor:
    def test_applies_nothing(self) -> None:
        # blind steps: on this noise-free full-batch problem a measured, un-updated step is (rightly)
        # flagged as worse than the loss model's forecast, which would cut every phase short
        loop = Loop(_config(predictor="null", check_every=0))
        loop.run(60)
        predict = [r for r in loop.records if r.plan.phase is Phase.PREDICT]
        assert len(predict) >= 5
        for r in predict:
            assert not r.outcome.applied_update
            assert _equal(r.before, r.after)
        assert loop.engine.stats()["clipped_tensors"] == 0
        assert loop.engine.stats()["refused_updates"] == 0


class TestLowRank:
    def test_runs_through_all_phases(self) -> None:
        loop = Loop(EngineConfig(schedule=_config().schedule, predictor="lowrank"))
        loop.run(60)
        assert {Phase.PREDICT, Phase.CORRECT} <= set(loop.phases())
        assert all(_finite(r.after) for r in loop.records)
        assert any(r.outcome.applied_update for r in loop.records if r.plan.phase is Phase.PREDICT)


class TestInjectedLosses:
    @pytest.mark.parametrize("bad_loss", [math.nan, math.inf])
    def test_non_finite_loss_in_predict_step_rolls_back(self, bad_loss: float) -> None:
        loop = Loop(_config())
        loop.run_until(_mid_phase_with_moved_params)
        snapshot = _clone(loop.engine.guard.snapshot)
        rollbacks = loop.engine.stats()["rollbacks"]
        record = loop.step(loss_override=bad_loss)
        assert record.plan.phase is Phase.PREDICT
        assert record.outcome.rolled_back and not record.outcome.applied_update
        assert record.outcome.level is DivergenceLevel.CRITICAL
        assert _equal(loop.params, snapshot)  # bit-exact
        assert _finite(loop.params)
        assert loop.engine.stats()["rollbacks"] == rollbacks + 1
        assert not loop.engine.guard.has_snapshot
        for name, p in loop.params.items():
            assert torch.equal(loop.engine.watch.updates.last[name], p.detach().float())
        loop.run(3)
        assert loop.phases(-3) == [Phase.FULL] * 3
        assert all(_finite(r.after) for r in loop.records)

    def test_loss_spike_in_predict_step_rolls_back_and_forces_full(self) -> None:
        loop = Loop(_config())
        loop.run_until(_mid_phase_with_moved_params)
        snapshot = _clone(loop.engine.guard.snapshot)
        last_loss = loop.engine.losses.measured
        assert last_loss is not None
        record = loop.step(loss_override=50.0 * last_loss)
        assert record.outcome.rolled_back and record.outcome.level is DivergenceLevel.CRITICAL
        assert any("loss" in reason for reason in record.outcome.reasons)
        assert _equal(loop.params, snapshot)
        loop.run(3)
        assert loop.phases(-3) == [Phase.FULL] * 3

    def test_non_finite_loss_in_real_step_skips_the_optimizer(self) -> None:
        loop = Loop(_config())
        loop.run(12)
        record = loop.step(loss_override=math.nan)
        assert record.plan.phase is Phase.FULL
        assert record.optimizer_calls == 0
        assert not record.outcome.applied_update
        assert _equal(record.before, record.after)
        assert loop.engine.stats()["nonfinite_real_steps"] == 1
        loop.run(3)
        assert loop.phases(-3) == [Phase.FULL] * 3

    def test_non_finite_grad_norm_can_still_call_the_optimizer(self) -> None:
        loop = Loop(_config())
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

    def test_regression_at_an_intermediate_correct_step_ends_the_phase(self) -> None:
        """Rollback at a CORRECT step that does not close the phase must not leave it half open."""
        loop = Loop(_config(check_every=0, min_predict_steps=8, max_predict_steps=8, correction_interval=2))
        # only the regression check may react here: silence the z-score signals
        loop.engine.monitor = DivergenceMonitor(min_history=10**6)
        loop.run_until(
            lambda lp: (
                lp.engine.controller.phase is Phase.PREDICT
                and lp.engine.controller.predicted_since_correct == 2
            )
        )
        assert loop.engine.controller.predict_remaining > 0  # the next CORRECT does not close the phase
        snapshot = _clone(loop.engine.guard.snapshot)  # taken when the phase opened
        assert not _equal(snapshot, loop.params)  # its predicted steps moved the weights
        record = loop.step(loss_override=1e3)
        assert record.plan.phase is Phase.CORRECT
        assert record.outcome.rolled_back
        assert record.optimizer_calls == 1  # the real step ran, then was undone with the phase
        assert _equal(loop.params, snapshot)  # bit-exact: where the phase began
        assert loop.engine.stats()["rollbacks"] == 1
        assert not loop.engine.controller.in_predict_phase
        assert loop.engine.phase is None
        loop.run(3)
        assert loop.phases(-3) == [Phase.FULL] * 3
        loop.run(30)
        assert loop.phases(-30).count(Phase.PREDICT) > 0
        assert all(_finite(r.after) for r in loop.records)


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


@pytest.mark.usefixtures("faulty_registry")
class TestFaultyPredictors:
    @pytest.mark.parametrize("name", ["test-nan", "test-raising"])
    def test_bad_prediction_mid_phase_rolls_back_and_forces_full(self, name: str) -> None:
        loop = Loop(_config(predictor=name, check_every=0))
        predictor = loop.engine.predictor
        assert isinstance(predictor, _FaultyPredictor)
        loop.run_until(_mid_phase_with_moved_params)
        snapshot = _clone(loop.engine.guard.snapshot)
        predictor.armed = True
        record = loop.step()
        predictor.armed = False
        assert record.plan.phase is Phase.PREDICT
        assert not record.outcome.applied_update
        assert record.optimizer_calls == 0
        assert _equal(loop.params, snapshot)  # rolled back to the start of the phase
        assert _finite(loop.params)
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
        assert all(_finite(r.after) for r in loop.records)

    @pytest.mark.parametrize("rollback", [True, False], ids=["rollback", "no_rollback"])
    def test_refused_or_rolled_back_predict_steps(self, rollback: bool) -> None:
        """A refused guess writes nothing: the weights stay those the step began with (rollback off) or
        go back to the phase's snapshot (rollback on), whichever the refusal led to."""
        loop = Loop(dataclasses.replace(_config(predictor="test-nan", check_every=0), rollback=rollback))
        predictor = loop.engine.predictor
        assert isinstance(predictor, _FaultyPredictor)
        loop.run_until(_mid_phase_with_moved_params)
        snapshot = _clone(loop.engine.guard.snapshot)
        predictor.armed = True
        record = loop.step()
        predictor.armed = False
        assert record.plan.phase is Phase.PREDICT
        assert loop.engine.stats()["refused_updates"] == 1  # the refusal happened, at this step
        assert any("non-finite" in reason for reason in record.outcome.reasons)
        assert not record.outcome.applied_update
        assert record.outcome.rolled_back is rollback
        assert not _equal(record.before, snapshot)  # so the two outcomes below are told apart
        assert _equal(record.after, snapshot if rollback else record.before)

    def test_raising_in_real_step_is_harmless(self) -> None:
        loop = Loop(_config(predictor="test-raising"))
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
        loop = Loop(_config(predictor="test-huge", check_every=0))
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
        assert all(_finite(r.after) for r in loop.records)


class _ScriptedMonitor(DivergenceMonitor):
    """The monitor, silent on its own (no z-score before 10**6 steps), reporting `next_level` once."""

    def __init__(self) -> None:
        super().__init__(min_history=10**6)
        self.next_level: DivergenceLevel | None = None

    def check(
        self, loss: float | None, grad_norm: float | None = None, prediction_error: float | None = None
    ) -> list[Alarm]:
        alarms = super().check(loss, grad_norm, prediction_error)
        if self.next_level is None:
            return alarms
        level, self.next_level = self.next_level, None
        return [Alarm(level, f"scripted {level.name}")]


def _scripted_loop(config: EngineConfig) -> tuple[Loop, _ScriptedMonitor]:
    loop = Loop(config)
    monitor = _ScriptedMonitor()
    loop.engine.monitor = monitor
    return loop, monitor


def _no_rollback(config: EngineConfig) -> EngineConfig:
    return dataclasses.replace(config, rollback=False)


class TestWithoutRollback:
    """`rollback=False`: an alarm in an open phase ends it as failed and forces FULL, keeping the weights."""

    def test_a_critical_predict_step_abandons_the_phase_and_keeps_the_weights(self) -> None:
        loop = Loop(_no_rollback(_config()))
        loop.run_until(_mid_phase_with_moved_params)
        snapshot = _clone(loop.engine.guard.snapshot)
        cap = loop.engine.controller.horizon_cap
        forced = loop.engine.stats()["forced_full"]
        record = loop.step(loss_override=math.nan)
        assert record.plan.phase is Phase.PREDICT
        assert record.outcome.level is DivergenceLevel.CRITICAL
        assert record.outcome.action is RecoveryAction.FORCE_FULL
        assert not record.outcome.rolled_back and not record.outcome.applied_update
        assert _equal(record.after, record.before)  # nothing applied, nothing restored
        assert not _equal(loop.params, snapshot)  # the phase's predicted updates stay
        engine = loop.engine
        assert engine.phase is None and not engine.guard.has_snapshot  # ended, its snapshot freed
        assert not engine.controller.in_predict_phase and engine.controller.predict_remaining == 0
        assert engine.stats()["rollbacks"] == 0 and engine.stats()["forced_full"] == forced + 1
        assert engine.controller.horizon_cap == max(2, cap // 2)  # a failed phase halves later horizons
        loop.run(3)
        assert loop.phases(-3) == [Phase.FULL] * 3

    def test_a_regressed_correct_step_keeps_its_real_update(self) -> None:
        loop, _ = _scripted_loop(
            _no_rollback(_config(check_every=0, min_predict_steps=4, max_predict_steps=4))
        )
        loop.run_until(
            lambda lp: (
                lp.engine.controller.phase is Phase.PREDICT and lp.engine.controller.predict_remaining == 0
            )
        )
        snapshot = _clone(loop.engine.guard.snapshot)
        record = loop.step(loss_override=1e3)  # the closing CORRECT step: the loss regressed
        assert record.plan.phase is Phase.CORRECT
        assert record.outcome.action is RecoveryAction.FORCE_FULL and not record.outcome.rolled_back
        assert any("regressed" in reason for reason in record.outcome.reasons)
        assert record.optimizer_calls == 1 and record.outcome.applied_update
        assert not _equal(record.after, record.before) and not _equal(record.after, snapshot)
        assert loop.engine.phase is None and not loop.engine.guard.has_snapshot
        assert loop.engine.stats()["rollbacks"] == 0
        loop.run(3)
        assert loop.phases(-3) == [Phase.FULL] * 3


@pytest.mark.usefixtures("faulty_registry")
def test_a_predictor_failing_at_an_intermediate_correct_step_ends_the_phase_without_rollback() -> None:
    """The guess scored at a CORRECT step that does not close the phase raises: the predictor is reset,
    so the phase cannot go on; the weights are not to blame, so its real step stands (no rollback, although
    rollback is on and a snapshot exists) and FULL steps follow."""
    loop = Loop(
        _config(
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
    snapshot = _clone(loop.engine.guard.snapshot)
    errors, resets = loop.engine.stats()["predictor_errors"], type(predictor).resets
    type(predictor).armed = True  # whichever instance of it the engine consults (the fixture restores it)
    record = loop.step()
    type(predictor).armed = False
    assert record.plan.phase is Phase.CORRECT
    assert record.outcome.reasons == ("the predictor failed (RuntimeError)",)
    assert record.outcome.level is DivergenceLevel.WARNING
    assert record.outcome.action is RecoveryAction.FORCE_FULL and not record.outcome.rolled_back
    assert record.optimizer_calls == 1 and record.outcome.applied_update
    assert not _equal(record.after, snapshot)  # the real step's weights stand
    stats = loop.engine.stats()
    assert stats["predictor_errors"] == errors + 1 and stats["rollbacks"] == 0
    assert type(predictor).resets > resets
    assert loop.engine.phase is None and not loop.engine.controller.in_predict_phase
    loop.run(3)
    assert loop.phases(-3) == [Phase.FULL] * 3


class TestCaution:
    """A CAUTION halves the rest of the open phase and the cap on later horizons; a phase whose closing
    CORRECT step raised one completes, but keeps the halved cap instead of widening it again."""

    @staticmethod
    def _loop() -> tuple[Loop, _ScriptedMonitor]:
        # no bandit: every phase's horizon is the cap, so the cap is what the phases show
        config = dataclasses.replace(_config(min_predict_steps=2, max_predict_steps=8), use_bandit=False)
        return _scripted_loop(config)

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


class TestDormant:
    """Far below the threshold the engine watches real updates only every n-th step; training is unchanged."""

    @staticmethod
    def _run(dormant_every: int, force: bool) -> Loop:
        schedule = PhaseSchedule(warmup_steps=5, full_steps=3, confidence_threshold=0.999, min_history=4)
        loop = Loop(EngineConfig(schedule=schedule, dormant_every=dormant_every))
        if force:
            loop.engine.wakefulness.dormant = lambda confidence: True  # whatever this problem's skill
        loop.run(80)
        return loop

    def test_observes_every_nth_full_step_and_trains_identically(self) -> None:
        dormant, awake = self._run(8, force=True), self._run(1, force=False)
        assert [r.plan.phase for r in dormant.records] == [r.plan.phase for r in awake.records]
        assert Phase.PREDICT not in {r.plan.phase for r in awake.records}
        assert _equal(dormant.params, awake.params)  # the optimizer stepped every step in both
        assert dormant.optimizer_calls == awake.optimizer_calls == 80
        assert awake.engine.predictor.observed == 80
        assert dormant.engine.predictor.observed == 5 + 75 // 8  # warmup, then every 8th FULL step
        # asleep, it keeps the sampled coordinates only; awake (dormant_every=1), the whole parameters
        assert not dormant.engine.awake and awake.engine.awake
        sample = dormant.engine.watch.sample
        sampled = {n: sample.gather(n, e) for n, e in awake.engine.predictor.ema.items()}
        assert {n: e.shape for n, e in dormant.engine.predictor.ema.items()} == {
            n: e.shape for n, e in sampled.items()
        }
        # (the averaged update itself is checked exactly in test_updates.py)

    def test_a_reachable_threshold_keeps_it_awake(self) -> None:
        schedule = PhaseSchedule(warmup_steps=5, full_steps=3, confidence_threshold=0.0, min_history=4)
        loop = Loop(EngineConfig(schedule=schedule, dormant_every=8))
        loop.run(40)
        assert not loop.engine.wakefulness.dormant(loop.engine.confidence)

    def test_a_sudden_jump_in_confidence_wakes_it_before_a_phase_opens(self) -> None:
        """Asleep, the predictor guesses sampled coordinates only: a confidence that leaps past the threshold
        in one step must first wake the engine (a FULL step), never open a phase on the sampled predictor."""
        schedule = PhaseSchedule(warmup_steps=5, full_steps=3, confidence_threshold=0.9, min_history=4)
        loop = Loop(EngineConfig(schedule=schedule, dormant_every=8))
        loop.engine.wakefulness.dormant = lambda confidence: True  # asleep, whatever this problem's skill
        loop.run(30)
        assert not loop.engine.awake
        del loop.engine.wakefulness.dormant
        loop.engine.confidence = lambda: 1.0  # the leap: from asleep to certain in one step
        awake_at_begin = []
        for _ in range(30):
            awake_at_begin.append(loop.engine.awake)
            loop.step()
        phases = loop.phases(30)
        assert Phase.PREDICT in phases and loop.engine.awake
        pairs = zip(awake_at_begin, phases, strict=True)
        assert all(awake for awake, phase in pairs if phase is Phase.PREDICT)
        predicted = [r.outcome for r in loop.records[30:] if r.outcome.phase is Phase.PREDICT]
        assert all(o.applied_update for o in predicted), [o.reasons for o in predicted]
