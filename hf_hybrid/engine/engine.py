"""HybridEngine: the whole algorithm behind two calls per optimizer step.

    plan = engine.begin_step()                       # which phase, and whether to measure the loss
    ... caller runs forward(+backward) for the step's micro-batches ...
    engine.finish_step(StepRecord(loss, grad_norm, lr), optimizer.step)   # where the real step would run

The caller (a Trainer, or any plain PyTorch loop) decides nothing. Everything the engine decides comes
from scalars identical on every rank, so no rank drifts. Step by step: docs/how-it-works.md.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from .accounting import StepCounters
from .alarm import Alarm, DivergenceLevel, nonfinite_step, worst_level
from .config import EngineConfig
from .footprint import MemoryMeter
from .learner import Learner
from .parts import EngineParts
from .phases import Phase
from .predict_phase import PhaseEnd, PredictPhase, PredictPhases
from .predictor import DeltaPredictor
from .recovery import RecoveryAction, applies_update, choose_action, describe
from .sharding import local
from .spike_guard import SpikeGuard
from .step import StepOutcome, StepPlan, StepRecord
from .wakefulness import Wakefulness

__all__ = ["HybridEngine", "StepOutcome", "StepPlan", "StepRecord"]

logger = logging.getLogger(__name__)

# The counters and bytes of `stats()` that go to the training log too.
LOGGED_STATS = (
    "backward_run",
    "backward_skipped",
    "predict_phases",
    "backward_skipped_fraction",
    "compute_saved_fraction",
    "rollbacks",
    "restores",
    "skips",
    "replays",
    "updates_taken_back",
    "skipped_updates",
    "predictor_bytes",
    "engine_bytes",
)


class _Part:
    """An engine attribute kept in the same-named field of its `EngineParts`: the state in one place."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, engine: HybridEngine | None, owner: type | None = None) -> Any:
        return self if engine is None else getattr(engine.parts, self.name)

    def __set__(self, engine: HybridEngine, value: Any) -> None:
        setattr(engine.parts, self.name, value)


class HybridEngine:
    """Phase controller, predictor, loss forecaster, residuals, divergence monitor and guard, wired."""

    config, params, shards, timer = _Part(), _Part(), _Part(), _Part()
    controller, watch, losses, monitor, store = _Part(), _Part(), _Part(), _Part(), _Part()
    corrector, counters, guard, spike_guard, meter = _Part(), _Part(), _Part(), _Part(), _Part()
    steps_since_real, last_level, max_confidence = _Part(), _Part(), _Part()

    def __init__(
        self,
        params: Mapping[str, torch.Tensor],
        config: EngineConfig | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        probe: Callable[[], float] | None = None,
        predictor: DeltaPredictor | None = None,
        spike_guard: SpikeGuard | None = None,
    ) -> None:
        """`probe()`: the loss of fixed batches; with it a predict phase is kept only if that loss fell
        over the phase. `predictor` replaces the one `config.predictor` names."""
        if not params:
            raise ValueError("HybridEngine needs at least one trainable parameter; the model has none")
        self.parts = EngineParts.build(params, config or EngineConfig(), optimizer, predictor, spike_guard)
        self.schedule = self.config.schedule
        self.probe = probe
        self.optimizer = optimizer
        self.wakefulness = Wakefulness(self.parts)
        self.learner = Learner(self.parts)
        self.phases = PredictPhases(self.parts, probe)
        self.recovery = StepRecovery(self.parts, self.phases, self.learner)
        self.plan: StepPlan | None = None
        self.step_number = 0  # the caller's number of the current step (`begin_step`), for log lines

    @property
    def predictor(self) -> DeltaPredictor:
        return self.watch.predictor

    @property
    def awake(self) -> bool:
        """False while the engine sleeps: buffers for a sample of the coordinates, no loss forecaster."""
        return self.parts.awake

    @property
    def phase(self) -> PredictPhase | None:
        """The open predict phase (None between phases)."""
        return self.phases.current

    # ---- per step -------------------------------------------------------------------------------

    def begin_step(self, step_number: int | None = None) -> StepPlan:
        """Decide the phase of the next optimizer step (once per step, on every rank); `step_number` is the
        caller's number for it in log lines (default: the engine's own count)."""
        self.timer.start_step()
        self.step_number = self.controller.steps_decided + 1 if step_number is None else step_number
        with self.timer.part("decide"):
            was_predicting = self.controller.in_predict_phase
            confidence = self.confidence()
            if self.controller.steps_decided >= self.schedule.warmup_steps:
                self.max_confidence = max(self.max_confidence, confidence)
            # a phase opens only on full-size buffers: a sleeping engine whose confidence jumped past the
            # threshold in one step runs this step in full and wakes at its end (`Wakefulness.update`)
            decisive = confidence if self.awake else 0.0
            phase = self.controller.decide(decisive, self.predictor.observed, self.phases.choose_horizon)
            if phase is Phase.PREDICT and not was_predicting:
                self.phases.open(self.losses.forecast_next, self.monitor.loss_stats)
            with self.timer.part("loss_forecaster"):
                self.losses.forecast()
            measure = phase.runs_backward or self.phases.checked()
            self.plan = StepPlan(phase, measure, None if measure else self.losses.measured)
            self.counters.add(f"steps_{phase.value}")
        return self.plan

    def finish_step(
        self, record: StepRecord, optimizer_step: Callable[[], None], skip_nonfinite_step: bool = True
    ) -> StepOutcome:
        """Run the step's update: the real optimizer step, or the predicted delta.
        `skip_nonfinite_step=False`: every real step reaches the optimizer (a fp16 GradScaler skips them)."""
        if self.plan is None:
            raise RuntimeError("finish_step() called without begin_step()")

        def plain_optimizer_step() -> None:  # the plain step's own work: charged to no part
            with self.timer.outside():
                optimizer_step()

        with self.timer.part("engine"):
            plan, self.plan = self.plan, None
            if plan.phase.runs_backward:
                outcome = self._real_step(plan.phase, record, plain_optimizer_step, skip_nonfinite_step)
            else:
                outcome = self._predict_step(record.loss if plan.measure_loss else None, record.learning_rate)
            # buffers come and go (a wake-up, a snapshot) or grow (a predicted write, a predictor's first
            # updates): count them again then only
            if self.meter.due() or not plan.phase.runs_backward or self.predictor.observed <= 2:
                with self.timer.part("memory"):
                    self.meter.update()
        self.timer.end_step()
        return outcome

    # ---- real steps (WARMUP, FULL, CORRECT) ----------------------------------------------------

    def _real_step(
        self, phase: Phase, record: StepRecord, optimizer_step: Callable[[], None], skip_nonfinite: bool
    ) -> StepOutcome:
        self.counters.add("backward_run")
        loss, grad_norm = record.loss, record.grad_norm
        alarms: list[Alarm] = []
        if phase is Phase.CORRECT and self.phase is not None:
            with self.timer.part("decide"):
                verdict = self.phases.verdict(loss, self.config.divergence_sigma)
            if verdict is not None:
                alarms.append(verdict)
        unusable = nonfinite_step(loss, grad_norm)
        finite = unusable is None
        if not finite:
            self.counters.add("nonfinite_real_steps")
            alarms.append(unusable)
        with self.timer.part("monitor"):
            alarms += self.monitor.check(
                loss, grad_norm, self.losses.forecast_error(loss) if finite else None
            )
        steps_ahead, self.steps_since_real = self.steps_since_real + 1, 0
        guarded = finite and phase is not Phase.CORRECT  # inside a predict phase a spike is the phase's
        if guarded:
            with self.timer.part("spike_guard"):
                alarms += self.spike_guard.alarms(self.step_number, loss, grad_norm, can_skip=skip_nonfinite)
        if not applies_update(alarms):  # the recovery rule's SKIP (or a rollback of the open phase)
            if not finite and not skip_nonfinite:  # a GradScaler must see it (it skips it itself)
                self.learner.real_update(optimizer_step)
            return self._outcome(phase, loss, False, alarms, self._recover(alarms, phase, optimizer_step))
        if guarded:
            with self.timer.part("decide"):
                self.wakefulness.update(self.confidence, self.step_number)
        # A step that may be applied always reaches the optimizer, as in the plain Trainer; a rollback or
        # restore decided below then puts back the snapshot or the guard's copy.
        look = not self.wakefulness.skips_look(phase, self.controller.steps_decided, self.confidence)
        step, losses = self.controller.steps_decided, (loss, self.losses.predicted)
        if guarded:
            with self.timer.part("spike_guard"):
                self.spike_guard.before_update(self.step_number)
        residual, alarm = self.learner.learn(optimizer_step, look, phase, step, steps_ahead, losses)
        if alarm is not None and self.phase is not None and self.controller.predict_remaining > 0:
            alarms.append(alarm)  # the phase would go on predicting with a predictor that was just reset
        if guarded:
            with self.timer.part("spike_guard"):  # the update just applied, judged by its size
                alarms += self.spike_guard.update_alarms(self.step_number)
        with self.timer.part("loss_forecaster"):
            self.losses.measure(loss, record.learning_rate, grad_norm, phase.index)
        action = self._recover(alarms, phase)
        applied = action is not RecoveryAction.SKIP  # a SKIP here took the applied update back
        if guarded and applied and action is not RecoveryAction.RESTORE:
            with self.timer.part("spike_guard"):  # a copy is due every `every` clean steps
                self.spike_guard.observe(self.step_number, loss, grad_norm)
        if phase is Phase.CORRECT and self.phase is not None:
            skill = 0.0 if residual is None else residual.skill(self.corrector.scale)
            # a phase validated under a CAUTION keeps the halved cap instead of widening it again
            self.phases.validated(skill, widen=action is not RecoveryAction.SHORTEN_HORIZON)
        return self._outcome(phase, loss, applied, alarms, action)

    # ---- predicted steps ------------------------------------------------------------------------

    def _predict_step(self, loss: float | None, lr: float) -> StepOutcome:
        self.counters.add("backward_skipped")
        self.counters.add("predict_checked" if loss is not None else "predict_blind")
        self.phases.record_predicted(loss)
        alarms: list[Alarm] = []
        if loss is not None:
            with self.timer.part("monitor"):
                alarms += self.monitor.check(loss, None, self.losses.forecast_error(loss))
            with self.timer.part("loss_forecaster"):
                self.losses.measure(loss, lr, None, Phase.PREDICT.index)
        if worst_level(alarms) >= DivergenceLevel.WARNING:  # the weights look bad already: apply nothing more
            return self._outcome(Phase.PREDICT, loss, False, alarms, self._recover(alarms, Phase.PREDICT))
        self.steps_since_real += 1
        applied, alarm = self.learner.write_guess(self.steps_since_real, self.config.max_delta)
        if alarm is not None:
            alarms.append(alarm)
        return self._outcome(Phase.PREDICT, loss, applied, alarms, self._recover(alarms, Phase.PREDICT))

    # ---- recovery: the one place that acts on what went wrong -----------------------------------

    def _recover(
        self, alarms: list[Alarm], step_phase: Phase, optimizer_step: Callable[[], None] | None = None
    ) -> RecoveryAction:
        """Perform the action the step's alarms call for, and log exactly that (`StepRecovery`);
        `optimizer_step`: a skipped step's, for a clean batch trained in the blamed one's place."""
        return self.recovery.act(alarms, step_phase, self.step_number, optimizer_step)

    def _outcome(
        self, phase: Phase, loss: float | None, applied: bool, alarms: list[Alarm], action: RecoveryAction
    ) -> StepOutcome:
        return StepOutcome.of(phase, loss, applied, alarms, action, self.losses.predicted)

    # ---- what the outside sees ------------------------------------------------------------------

    def confidence(self) -> float:
        """Measured: mean recent skill of the predictor, capped by the loss forecaster's calibration."""
        confidence = self.corrector.confidence(self.store)
        if self.losses.trusted:
            _, std = self.monitor.loss_stats()
            tolerance = 2.0 * std if math.isfinite(std) and std > 0 else math.inf
            confidence = min(confidence, self.store.loss_calibration(tolerance))
        return confidence

    @property
    def seconds(self) -> float:
        """Time charged to the hybrid machinery so far (all parts; see `timing`)."""
        return self.timer.total

    def timing(self) -> dict[str, Any]:
        """The hybrid machinery's time against the step time, in all and by part (varies run to run)."""
        return self.timer.summary()

    def stats(self) -> dict[str, Any]:
        """Counters, bytes, confidence and phase; deterministic (a resumed run reports what the
        uninterrupted one does)."""
        return engine_stats(
            self.config,
            self.counters,
            self.meter,
            self.spike_guard,
            predictor=self.watch.predictor_name,
            predictor_bytes=self.watch.predictor_bytes(),
            max_confidence=self.max_confidence,
            phase=self.controller.phase,
            warmup_steps_left=self.controller.warmup_steps_left(),
        )

    def metrics(self) -> dict[str, float]:
        """Scalars for the training log (keys without the `hybrid/` prefix)."""
        stats = self.stats()
        out: dict[str, float] = {
            **self.controller.metrics(),
            "confidence": self.confidence(),
            "corrector_scale": self.corrector.scale,
            "divergence_level": float(self.last_level),
            "awake": float(self.awake),
            **self.store.summary(self.corrector.scale, recent=16),
            **{key: float(stats[key]) for key in LOGGED_STATS},
            **{f"steps_{phase}": float(n) for phase, n in stats["steps_per_phase"].items()},
            **self.losses.metrics(),
        }
        return {k: float(v) for k, v in out.items() if v is not None and math.isfinite(float(v))}

    def nbytes(self) -> int:
        """Bytes of the engine's tensors now (counted; `stats()` has them by device, as last counted)."""
        return sum(self.meter.measure().values())

    # ---- checkpointing ---------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly, mid-phase included."""
        if self.plan is not None:
            raise RuntimeError("cannot save the engine in the middle of an optimizer step")
        # the spike guard's copies start again from the state being saved, as a resumed run's do
        self.spike_guard.rebase(self.step_number)
        return {**self.parts.state_dict(), **self.phases.state_dict()}

    def continue_accounting(self, state: Mapping[str, Any]) -> None:
        """`hybrid_restart_engine`: the counters, time and peak bytes continue; what it learnt starts over."""
        self.parts.continue_accounting(state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a saved engine; refuses a state that belongs to another configuration or model."""
        self.parts.load_state_dict(state)
        self.phases.load_state_dict(state)
        self.plan = None


class StepRecovery:
    """The one place that acts on what went wrong: performs `recovery.choose_action` and logs exactly that."""

    def __init__(self, parts: EngineParts, phases: PredictPhases, learner: Learner) -> None:
        self.parts = parts
        self.phases = phases
        self.learner = learner

    def act(
        self,
        alarms: list[Alarm],
        step_phase: Phase,
        step: int,
        optimizer_step: Callable[[], None] | None = None,
    ) -> RecoveryAction:
        """Choose and perform the action for `step`'s alarms (the caller's step number, for the log)."""
        parts = self.parts
        with parts.timer.part("recovery"):
            phase_was_open = self.phases.current is not None
            replayed: int | None = None
            action = choose_action(
                alarms,
                phase_open=phase_was_open,
                can_roll_back=parts.config.rollback and parts.guard.has_snapshot,
                can_restore=lambda: parts.spike_guard.can_restore(step, _spikes(alarms)),
            )
            parts.last_level = worst_level(alarms)
            if action is RecoveryAction.ROLLBACK:
                with parts.timer.part("snapshot"):
                    parts.watch.reset_to(parts.guard.restore_snapshot())
                parts.corrector.penalize()
                parts.counters.add("rollbacks")
                self.phases.end(PhaseEnd.ROLLED_BACK)
                self._force_full()
            elif action is RecoveryAction.RESTORE:
                self._restore(alarms, step)
            elif action is RecoveryAction.SKIP:
                if any(a.takes_back for a in alarms):
                    self._take_back(step)
                if any(a.spike for a in alarms):
                    replaced = any(a.replaces_batch for a in alarms) and optimizer_step is not None
                    replayed = parts.spike_guard.skipped(step, replaced)
                    if replayed is not None and optimizer_step is not None:
                        with parts.timer.part("spike_guard"):  # the predictors see it in their next look
                            self.learner.real_update(optimizer_step, look=False)
                parts.counters.add("skipped_updates")
                self._force_full()
            elif action is RecoveryAction.FORCE_FULL:
                if self.phases.current is not None:
                    self.phases.end(PhaseEnd.ABANDONED)
                self._force_full()
            elif action is RecoveryAction.SHORTEN_HORIZON:
                parts.controller.shorten()
            if action is not RecoveryAction.CONTINUE:
                full_steps = parts.config.schedule.full_steps
                text, notable = describe(action, alarms, full_steps, phase_was_open, replayed)
                _log_action(step, step_phase, action, text, notable)
        return action

    def _restore(self, alarms: list[Alarm], step: int) -> None:
        """The spike guard puts its copy back; the predictors forget the updates they saw since."""
        with self.parts.timer.part("spike_guard"):
            self.parts.spike_guard.restore(step, _spikes(alarms))
            self._forget_updates()
        self._force_full()

    def _take_back(self, step: int) -> None:
        """The update check puts back the weights before the outsized update; the predictors forget it."""
        with self.parts.timer.part("spike_guard"):
            self.parts.spike_guard.take_back(step)
            self._forget_updates()

    def _forget_updates(self) -> None:
        watch = self.parts.watch
        watch.reset_to({name: local(p).detach() for name, p in self.parts.params.items()})
        watch.reset()

    def _force_full(self) -> None:
        self.parts.counters.add("forced_full")
        self.parts.controller.force_full(self.parts.config.schedule.full_steps)


def engine_stats(
    config: EngineConfig,
    counters: StepCounters | None = None,
    meter: MemoryMeter | None = None,
    spike_guard: SpikeGuard | None = None,
    *,
    predictor: str | None = None,
    predictor_bytes: int = 0,
    max_confidence: float = 0.0,
    phase: Phase | None = None,
    warmup_steps_left: int | None = None,
) -> dict[str, Any]:
    """The keys of `HybridEngine.stats()`, in one place; given the configuration alone, those of a run no
    engine drove (the plain Trainer's): the same keys, nothing counted."""
    return {
        **(counters or StepCounters()).summary(config.probe_cost),
        "predictor": predictor or config.predictor,
        "predictor_bytes": predictor_bytes,
        **(meter or MemoryMeter(tuple)).stats(),
        "max_confidence": max_confidence,
        "confidence_threshold": config.schedule.confidence_threshold,
        "phase": None if phase is None else phase.value,
        "warmup_steps_left": warmup_steps_left,
        **(spike_guard or SpikeGuard.off()).stats(),
    }


def _spikes(alarms: list[Alarm]) -> str:
    return "; ".join(a.reason for a in alarms if a.restorable)


def _log_action(step: int, phase: Phase, action: RecoveryAction, text: str, notable: bool) -> None:
    """One log line per action taken, tagged so that a handler can count them (the fault tests do)."""
    (logger.warning if notable else logger.info)(
        "hf_hybrid: step %d (%s): %s: %s",
        step,
        phase.value,
        action.value,
        text,
        extra={"hybrid_action": action.value, "hybrid_step": step},
    )
