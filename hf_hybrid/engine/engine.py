"""HybridEngine: the whole algorithm behind two calls per optimizer step.

    plan = engine.begin_step()                       # which phase, and whether to measure the loss
    ... caller runs forward(+backward) for the step's micro-batches ...
    engine.finish_step(StepRecord(loss, grad_norm, lr), optimizer.step)   # where the real step would run

The caller (a Trainer, or any plain PyTorch loop) never decides anything itself; the engine never
reaches into the caller except through the optimizer-step callable. Everything it decides is derived
from scalars that are identical on every rank (the caller all-reduces the loss), so no rank drifts.

One step, end to end: `begin_step` asks the controller for the phase (opening a `PredictPhase` and
taking the rollback snapshot when one starts). `finish_step` then runs a real step (`_real_step`: the
CORRECT step's validation of its phase, finiteness, the divergence monitor, then the optimizer step and
the scoring of the predictor's guess against the real update) or a predicted one (`_predict_step`: the
monitor on the measured loss, then the predicted update through the guard). Whatever went wrong is an
`Alarm`; `_recover` turns the step's alarms into one `RecoveryAction`, performs it and logs it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from .accounting import StepCounters
from .bandit import HorizonBandit, default_arms, phase_reward
from .config import EngineConfig
from .divergence import DivergenceLevel, DivergenceMonitor
from .footprint import MemoryMeter
from .guard import ParameterGuard
from .loss_watch import LossWatch
from .phases import Phase, PhaseController
from .predict_phase import PhaseEnd, PredictPhase, reference_level
from .predictor import (
    DeltaPredictor,
    Deltas,
    delta_dot_products,
    resolve_predictor_name,
)
from .recovery import (
    NONFINITE_STEP,
    Alarm,
    RecoveryAction,
    alarms_from_report,
    choose_action,
    describe,
    worst_level,
)
from .residuals import Corrector, Residual, ResidualStore
from .sharding import ShardGroup
from .state import FORMAT_VERSION, describe_mismatch, describe_sharding_mismatch, parameter_fingerprint
from .timing import PartTimer, clock_for
from .watch import UpdateWatch

logger = logging.getLogger(__name__)

# The sleeping engine wakes when its confidence reaches this share of the threshold.
WAKE_AT = 0.75
# The counters and bytes of `stats()` that go to the training log too.
LOGGED_STATS = (
    "backward_run",
    "backward_skipped",
    "predict_phases",
    "backward_skipped_fraction",
    "compute_saved_fraction",
    "rollbacks",
    "predictor_bytes",
    "engine_bytes",
)
# FULL-step losses whose batch-to-batch noise a predict phase is judged against.
REFERENCE_WINDOW = 17


@dataclass(frozen=True)
class StepPlan:
    phase: Phase
    measure_loss: bool


@dataclass(frozen=True)
class StepRecord:
    """What the caller measured in one optimizer step: the loss (averaged over ranks; None when a
    predicted step measured nothing), the gradient norm (None in predicted steps) and the learning rate."""

    loss: float | None
    grad_norm: float | None
    learning_rate: float


@dataclass(frozen=True)
class StepOutcome:
    phase: Phase
    loss: float | None
    applied_update: bool
    rolled_back: bool
    level: DivergenceLevel
    reasons: tuple[str, ...] = ()
    action: RecoveryAction = RecoveryAction.CONTINUE


class HybridEngine:
    """Phase controller, predictor, loss forecaster, residuals, divergence monitor and guard, wired."""

    def __init__(
        self,
        params: Mapping[str, torch.Tensor],
        config: EngineConfig | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        probe: Callable[[], float] | None = None,
        predictor: DeltaPredictor | None = None,
    ) -> None:
        """`probe()` returns the loss of fixed batches (identical on every rank); with it, a predict phase
        is kept only if that loss fell from the phase's start to its end, instead of the noisier
        training-loss regression test. `predictor` replaces the one `config.predictor` names."""
        self.config = config or EngineConfig()
        if not params:
            raise ValueError("HybridEngine needs at least one trainable parameter; the model has none")
        self.params = dict(params)
        self.shards = ShardGroup.of(self.params)  # FSDP2's sharded DTensors, or none
        self.probe = probe
        # what the hybrid machinery costs, by part; the caller's hooks are charged to it too
        self.timer = PartTimer(clock_for(self.params.values()))
        s = self.config.schedule
        self.controller = PhaseController(s)
        self.bandit = HorizonBandit(
            default_arms(s.min_predict_steps, s.max_predict_steps), seed=self.config.seed, exploration=0.3
        )
        if predictor is not None and not isinstance(predictor, DeltaPredictor):
            raise TypeError(
                f"`predictor` must be a DeltaPredictor instance, got {type(predictor).__qualname__}"
            )
        self.optimizer = optimizer
        # `dormant_every=1` asks for an engine that watches every step in full: it never sleeps; nor does
        # a scripted one, whose predict phases open whatever the confidence (and need full-size guesses)
        self.watch = UpdateWatch(
            self.params,
            resolve_predictor_name(self.config.predictor, optimizer),
            self.config.predictor_kwargs,
            optimizer,
            self.config.seed,
            may_sleep=s.confidence_threshold > 0 and self.config.dormant_every > 1 and s.script is None,
            predictor=predictor,
            shards=self.shards,
        )
        self.losses = LossWatch(self.config.seed, awake=self.watch.awake)
        self.monitor = DivergenceMonitor(sigma=self.config.divergence_sigma)
        self.store = ResidualStore()
        self.corrector = Corrector()
        self.guard = ParameterGuard(self.params, self.config.snapshot_device, self.shards, self.timer)
        self.counters = StepCounters()
        self.phase: PredictPhase | None = None
        self.plan: StepPlan | None = None
        self.steps_since_real = 0
        self.last_level = DivergenceLevel.NORMAL
        self.last_predicted_loss: float | None = None
        self.last_measured_loss: float | None = None
        self.max_confidence = 0.0  # highest confidence measured after warmup (the summary's "why not")
        self.meter = MemoryMeter(self._tensors)

    @property
    def predictor(self) -> DeltaPredictor:
        return self.watch.predictor

    @property
    def predictor_name(self) -> str:
        return self.watch.predictor_name

    @property
    def awake(self) -> bool:
        """False while the engine sleeps: buffers for a sample of the coordinates, no loss forecaster."""
        return self.watch.awake

    def _update_wakefulness(self) -> None:
        """Sleep (sampled buffers, no loss forecaster) while the skill is unknown or far from the
        threshold; wake (full-size buffers) when it nears it: at `WAKE_AT` of the threshold, and back to
        sleep under half of it (the gap keeps a skill hovering near one bound from allocating and freeing
        buffers at every step). Called at WARMUP/FULL steps, when no predict phase is open."""
        if not self.watch.can_sleep:
            return
        s = self.config.schedule
        sleepy = self._dormant() or (
            not self.awake
            and (len(self.store) < s.min_history or self.confidence() < WAKE_AT * s.confidence_threshold)
        )
        if sleepy == (not self.awake):
            return
        with self.timer.part("wake"):
            self.watch.set_awake(not sleepy)
            self.losses.set_awake(not sleepy)
        self.last_predicted_loss = None
        self.meter.changed = True
        logger.info(
            "hf_hybrid: step %d: confidence %.3f (threshold %.3f): the engine %s",
            self.controller.steps_decided,
            self.confidence(),
            s.confidence_threshold,
            "sleeps (sampled coordinates only)" if sleepy else "wakes (full-size buffers)",
        )

    # ---- per step -------------------------------------------------------------------------------

    def begin_step(self) -> StepPlan:
        """Decide the phase of the next optimizer step (call once per step, on every rank)."""
        self.timer.start_step()
        with self.timer.part("decide"):
            was_predicting = self.controller.in_predict_phase
            confidence = self.confidence()
            if self.controller.steps_decided >= self.config.schedule.warmup_steps:
                self.max_confidence = max(self.max_confidence, confidence)
            # a phase opens only on full-size buffers: a sleeping engine whose confidence jumped past the
            # threshold in one step runs this step in full and wakes at its end (`_update_wakefulness`)
            decisive = confidence if self.awake else 0.0
            phase = self.controller.decide(decisive, self.predictor.observed, self._choose_horizon)
            if phase is Phase.PREDICT and not was_predicting:
                self._open_phase()
            with self.timer.part("loss_forecaster"):
                self.last_predicted_loss = _finite_or_none(self.losses.next_loss())
            measure = phase.runs_backward or self._is_checked_predict_step()
            self.plan = StepPlan(phase, measure)
            self.counters.add(f"steps_{phase.value}")
        return self.plan

    def finish_step(
        self, record: StepRecord, optimizer_step: Callable[[], None], skip_nonfinite_step: bool = True
    ) -> StepOutcome:
        """Run the step's update: the real optimizer step, or the predicted delta.

        `skip_nonfinite_step=False` is for callers whose optimizer already skips non-finite gradients
        (a fp16 GradScaler) and must be called on every real step.
        """
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
                loss = record.loss if plan.measure_loss else None
                outcome = self._predict_step(loss, record.learning_rate)
            if self.meter.changed or not plan.phase.runs_backward or self.predictor.observed <= 2:
                # buffers appear at a wake-up, a phase's snapshot, a predicted write, a predictor's first
                # updates
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
                alarms += self._validate_phase(loss)
        finite = loss is not None and math.isfinite(loss) and (grad_norm is None or math.isfinite(grad_norm))
        if not finite:
            self.counters.add("nonfinite_real_steps")
            alarms.append(Alarm(DivergenceLevel.CRITICAL, f"{NONFINITE_STEP} ({loss}, {grad_norm})"))
        with self.timer.part("monitor"):
            report = self.monitor.check(loss, grad_norm, self._forecast_error(loss) if finite else None)
        alarms += alarms_from_report(report)
        steps_ahead, self.steps_since_real = self.steps_since_real + 1, 0
        if not finite:  # the gradient is unusable: the step is not applied
            if not skip_nonfinite:  # a GradScaler must still see it (it skips non-finite steps itself)
                optimizer_step()
                self.guard.forget_compensation()
                with self.timer.part("real_update"):
                    self.watch.take()
            return self._outcome(phase, loss, False, alarms, self._recover(alarms, phase))
        # A finite step always reaches the optimizer, as in the plain Trainer; a rollback decided below
        # then restores the snapshot, so a rolled-back step ends exactly where its phase began.
        residual = self._observe_real_step(phase, record, optimizer_step, steps_ahead, alarms)
        with self.timer.part("loss_forecaster"):
            self.losses.observe(loss, record.learning_rate, grad_norm, phase.index)
        self.last_measured_loss = loss
        action = self._recover(alarms, phase)
        if phase is Phase.CORRECT and self.phase is not None:
            if self.controller.predict_remaining > 0:
                # intermediate CORRECT: the validated state is the new rollback point
                with self.timer.part("snapshot"):
                    self.guard.take_snapshot()
                self.meter.changed = True
            else:
                skill = 0.0 if residual is None else residual.skill(self.corrector.scale)
                # a phase validated under a CAUTION keeps the halved cap instead of widening it again
                self._end_phase(PhaseEnd.COMPLETED, skill, widen=action is not RecoveryAction.SHORTEN_HORIZON)
        return self._outcome(phase, loss, True, alarms, action)

    def _observe_real_step(
        self,
        phase: Phase,
        record: StepRecord,
        optimizer_step: Callable[[], None],
        steps_ahead: int,
        alarms: list[Alarm],
    ) -> Residual | None:
        """The optimizer step itself, and what the engine learns from it: the real update, and the
        score of its own guess of that update. Returns the residual (None when not scored)."""
        if phase is not Phase.CORRECT:
            with self.timer.part("decide"):
                self._update_wakefulness()
        sparse = (phase is Phase.FULL and self._dormant()) or (phase is Phase.WARMUP and self._early_warmup())
        if sparse and self.watch.sampled_updates.unobserved_steps + 1 < self.config.dormant_every:
            optimizer_step()
            self.guard.forget_compensation()
            self.watch.skip()
            return None
        scored = phase is not Phase.WARMUP  # warmup only observes: no prediction to score, no cost
        predicted, failure = self._guess(steps_ahead, sampled=True) if scored else (None, None)
        if failure is not None and self.phase is not None and self.controller.predict_remaining > 0:
            # the phase would go on predicting with a predictor that was just reset
            alarms.append(Alarm(DivergenceLevel.WARNING, failure, blames_weights=False))
        optimizer_step()
        self.guard.forget_compensation()
        with self.timer.part("real_update"):
            sampled, whole = self.watch.take()
        residual = None
        if scored:  # on the sampled coordinates: sums over the whole sample, all ranks' parts added
            with self.timer.part("score"):
                pd, pp, dd = self.shards.sum(delta_dot_products(predicted, sampled))
            if not (math.isfinite(pd) and math.isfinite(pp)):
                logger.warning(
                    "hf_hybrid: predictor %r produced a non-finite guess; reset it", self.predictor_name
                )
                self.counters.add("refused_updates")
                self.watch.reset()
                pd = pp = 0.0
            residual = Residual(
                self.controller.steps_decided,
                phase.value,
                steps_ahead,
                pd,
                pp,
                dd,
                record.loss,
                self.last_predicted_loss,
            )
            with self.timer.part("residuals"):
                self.store.add(residual)
                self.corrector.update(residual)
        with self.timer.part("observe"):
            self.watch.observe(sampled, whole)
        return residual

    def _validate_phase(self, loss: float | None) -> list[Alarm]:
        """The CORRECT step's verdict on the predicted updates since the last validated point: with a
        probe, did its loss fall; otherwise did the training loss regress past the noise."""
        probed = self.probe is not None and self.phase.probe_before is not None
        probe_after = self._probe() if probed and loss is not None and math.isfinite(loss) else None
        failure = self.phase.verdict(loss, probe_after, self.config.divergence_sigma)
        return [] if failure is None else [Alarm(DivergenceLevel.WARNING, failure)]

    # ---- predicted steps ------------------------------------------------------------------------

    def _predict_step(self, loss: float | None, lr: float) -> StepOutcome:
        self.counters.add("backward_skipped")
        self.counters.add("predict_checked" if loss is not None else "predict_blind")
        self.phase.record_predicted(loss)
        alarms: list[Alarm] = []
        if loss is not None:
            with self.timer.part("monitor"):
                alarms += alarms_from_report(self.monitor.check(loss, None, self._forecast_error(loss)))
            self.last_measured_loss = loss
            if math.isfinite(loss):
                with self.timer.part("loss_forecaster"):
                    self.losses.observe(loss, lr, None, Phase.PREDICT.index)
        if worst_level(alarms) >= DivergenceLevel.WARNING:  # the weights look bad already: apply nothing more
            return self._outcome(Phase.PREDICT, loss, False, alarms, self._recover(alarms, Phase.PREDICT))
        self.steps_since_real += 1
        predicted, failure = self._guess(self.steps_since_real)
        applied = False
        if failure is not None:
            alarms.append(Alarm(DivergenceLevel.CRITICAL, failure))
            self.counters.add("refused_updates")
        elif predicted is not None:
            with self.timer.part("guard"):
                result, deltas = self.guard.apply(predicted, self.config.max_delta, self.corrector.scale)
            if result.applied:
                self.counters.add("clipped_tensors", result.clipped_tensors)
                with self.timer.part("real_update"):
                    self.watch.shift(deltas)
                applied = True
            else:
                alarms.append(Alarm(DivergenceLevel.CRITICAL, result.reason))
                self.counters.add("refused_updates")
                self.watch.reset()
        return self._outcome(Phase.PREDICT, loss, applied, alarms, self._recover(alarms, Phase.PREDICT))

    def _guess(self, steps_ahead: int, sampled: bool = False) -> tuple[Deltas | None, str | None]:
        """The full-size guess a predict step applies, or (`sampled`) the one at the sample, to score."""
        with self.timer.part("guess"):
            ask = self.watch.sampled_guess if sampled else self.watch.guess
            predicted, failure = ask(steps_ahead)
        if failure is not None:
            self.counters.add("predictor_errors")
        return predicted, failure

    # ---- recovery: the one place that acts on what went wrong -----------------------------------

    def _action_for(self, alarms: list[Alarm]) -> RecoveryAction:
        can_roll_back = self.config.rollback and self.guard.has_snapshot
        return choose_action(alarms, phase_open=self.phase is not None, can_roll_back=can_roll_back)

    def _recover(self, alarms: list[Alarm], step_phase: Phase) -> RecoveryAction:
        """Perform the action the step's alarms call for, and log exactly that."""
        with self.timer.part("recovery"):
            action = self._action_for(alarms)
            self.last_level = worst_level(alarms)
            phase_was_open = self.phase is not None
            if action is RecoveryAction.ROLLBACK:
                self._restore_snapshot()
                self._end_phase(PhaseEnd.ROLLED_BACK, 0.0)
                self._force_full()
            elif action is RecoveryAction.FORCE_FULL:
                if self.phase is not None:
                    self._end_phase(PhaseEnd.ABANDONED, 0.0)
                self._force_full()
            elif action is RecoveryAction.SHORTEN_HORIZON:
                self.controller.shorten()
            if action is not RecoveryAction.CONTINUE:
                text, notable = describe(action, alarms, self.config.schedule.full_steps, phase_was_open)
                step = self.controller.steps_decided
                (logger.warning if notable else logger.info)(
                    "hf_hybrid: step %d (%s): %s: %s",
                    step,
                    step_phase.value,
                    action.value,
                    text,
                    extra={"hybrid_action": action.value, "hybrid_step": step},
                )
        return action

    def _restore_snapshot(self) -> None:
        with self.timer.part("snapshot"):
            self.guard.restore_snapshot()
            self.watch.reset_to(self.guard.snapshot)
        self.corrector.penalize()
        self.counters.add("rollbacks")

    def _force_full(self) -> None:
        self.counters.add("forced_full")
        self.controller.force_full(self.config.schedule.full_steps)

    # ---- predict-phase bookkeeping --------------------------------------------------------------

    def _choose_horizon(self, cap: int) -> int:
        s = self.config.schedule
        return self.bandit.select(cap) if self.config.use_bandit else min(cap, s.max_predict_steps)

    def _open_phase(self) -> None:
        with self.timer.part("snapshot"):
            self.guard.take_snapshot()
        self.meter.changed = True
        forecaster = self.losses.forecaster
        forecast = None
        if forecaster is not None and forecaster.num_observed:
            forecast = lambda: forecaster.forecast(1).mean[0]  # noqa: E731 - only run when enough losses
        full = [r.loss_actual for r in self.store.recent(REFERENCE_WINDOW, phase="full")]
        with self.timer.part("loss_forecaster"):
            mean, std = reference_level(forecast, full) or self.monitor.loss_stats()
        self.phase = PredictPhase(
            opened_at=self.controller.steps_decided,
            horizon=self.controller.horizon,
            reference_loss=mean,
            reference_noise=std,
            probe_before=self._probe(),
        )
        self.counters.add("predict_phases")

    def _end_phase(self, how: PhaseEnd, skill: float, widen: bool = True) -> None:
        """Close the open phase: reward the bandit, let the controller narrow (failed) or widen (`widen`)
        later horizons, free the snapshot."""
        phase, self.phase = self.phase, None
        failed = how is not PhaseEnd.COMPLETED
        self.meter.changed = True  # the snapshot is freed
        if self.config.use_bandit and phase.horizon in self.bandit.arms:
            self.bandit.update(
                phase.horizon, phase_reward(phase.predicted, self.config.schedule.full_steps, failed, skill)
            )
        self.controller.end_phase(failed, widen)
        self.guard.drop_snapshot()

    def _forecast_error(self, loss: float | None) -> float | None:
        """Signed (actual - forecast): the monitor scores it one-sided, so a better loss never alarms."""
        if loss is None or self.last_predicted_loss is None or not math.isfinite(loss):
            return None
        return loss - self.last_predicted_loss

    def _probe(self) -> float | None:
        if self.probe is None:
            return None
        self.counters.add("probe_evaluations")
        with self.timer.part("probe"):  # forwards the plain step does not run: the method's own cost
            value = float(self.probe())
        return value if math.isfinite(value) else math.inf

    def _early_warmup(self) -> bool:
        """Warmup only feeds the predictor; its dense history is needed just before the first phase."""
        remaining = self.config.schedule.warmup_steps - self.controller.steps_decided
        return remaining > 2 * self.config.schedule.min_history

    def _dormant(self) -> bool:
        """Predictions have stayed far from useful: watch the real updates only every n-th step.

        Observing costs several passes over every trainable parameter per step (~15% of a CPU step when
        fully fine-tuning a 22M-parameter model); while the measured confidence sits under half the
        threshold, an averaged update every `dormant_every` steps keeps the predictor and its score alive
        at a fraction of that. (A sleeping engine's observations cost far less: see `_update_wakefulness`.)
        """
        threshold = self.config.schedule.confidence_threshold
        if self.config.dormant_every <= 1 or threshold <= 0:
            return False
        if len(self.store) < self.config.schedule.min_history:
            return False
        return self.confidence() < threshold / 2

    def _is_checked_predict_step(self) -> bool:
        every = self.config.check_every
        return every > 0 and self.controller.predicted_since_correct % every == 0

    def _outcome(
        self, phase: Phase, loss: float | None, applied: bool, alarms: list[Alarm], action: RecoveryAction
    ) -> StepOutcome:
        return StepOutcome(
            phase,
            loss,
            applied,
            action is RecoveryAction.ROLLBACK,
            worst_level(alarms),
            tuple(a.reason for a in alarms),
            action,
        )

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

    def compute_units(self) -> float:
        """Forward-pass units spent: 3 per real step, 1 per checked predicted step, the probe's cost."""
        return self.counters.compute_units(self.config.probe_cost)

    def stats(self) -> dict[str, Any]:
        """Counters and bytes (deterministic: a resumed run reports what the uninterrupted one does), the
        highest confidence reached against the threshold, and the predictor's name."""
        return {
            **self.counters.summary(self.config.probe_cost),
            "predictor": self.predictor_name,
            "predictor_bytes": self.watch.predictor_bytes(),
            **self.meter.stats(),
            "max_confidence": self.max_confidence,
            "confidence_threshold": self.config.schedule.confidence_threshold,
        }

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
        if self.last_predicted_loss is not None:
            out["predicted_loss"] = self.last_predicted_loss
        if self.last_measured_loss is not None:
            out["measured_loss"] = self.last_measured_loss
        return {k: float(v) for k, v in out.items() if v is not None and math.isfinite(float(v))}

    def _tensors(self) -> list[torch.Tensor]:
        return [
            *self.watch.tensors(),
            *self.guard.snapshot.values(),
            *self.guard.compensation.values(),
            *self.losses.tensors(),
        ]

    def memory(self) -> dict[str, int]:
        """Bytes of the engine's own tensors now, by where they live (`device`: an accelerator; `host`)."""
        return self.meter.measure()

    def nbytes(self) -> int:
        """Bytes of the engine's tensors now (counted; `memory()` splits them by device)."""
        return sum(self.memory().values())

    # ---- checkpointing ---------------------------------------------------------------------------

    def _parts(self) -> dict[str, Any]:
        """The components that checkpoint themselves, in the order they are restored."""
        return {
            "controller": self.controller,
            "bandit": self.bandit,
            "watch": self.watch,
            "losses": self.losses,
            "monitor": self.monitor,
            "store": self.store,
            "corrector": self.corrector,
            "guard": self.guard,
            "counters": self.counters,
        }

    def parameter_fingerprint(self) -> dict[str, list[int]]:
        return parameter_fingerprint(self.params)

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly, mid-phase included (tensors and plain values).

        With sharded parameters the tensors are this rank's shards and `sharding` records the world size
        and the rank: each rank saves its own state, and it loads back only on the same rank of the same
        world size (resharding a predictor's buffers or a snapshot is not supported)."""
        if self.plan is not None:
            raise RuntimeError("cannot save the engine in the middle of an optimizer step")
        return {
            "format_version": FORMAT_VERSION,
            "config": self.config.fingerprint(),
            "parameters": self.parameter_fingerprint(),
            **{name: part.state_dict() for name, part in self._parts().items()},
            "phase": None if self.phase is None else self.phase.state_dict(),
            "steps_since_real": self.steps_since_real,
            "last_level": int(self.last_level),
            "last_predicted_loss": self.last_predicted_loss,
            "last_measured_loss": self.last_measured_loss,
            "max_confidence": self.max_confidence,
            "seconds": self.seconds,
            "timing": self.timer.state_dict(),
            "peak_memory": self.meter.state_dict(),
            **({"sharding": self.shards.describe()} if self.shards.sharded else {}),
        }

    def continue_accounting(self, state: Mapping[str, Any]) -> None:
        """A new engine that carries on a run (`hybrid_restart_engine`): the counters, the engine's own
        time and its peak bytes continue from a saved state; everything it learnt starts over."""
        self.counters.load_state_dict(state["counters"])
        self._load_timing(state)
        self.meter.merge_peak(state["peak_memory"])

    def _load_timing(self, state: Mapping[str, Any]) -> None:
        """The timing carries on; a state saved before it was kept by part has none, and it restarts."""
        if "timing" in state:
            self.timer.load_state_dict(state["timing"])

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a saved engine; refuses a state that belongs to another configuration or model."""
        version = state.get("format_version")
        if version != FORMAT_VERSION:
            raise ValueError(
                f"hybrid state format version {version!r} is not supported by this hf_hybrid "
                f"(supports {FORMAT_VERSION}); upgrade hf_hybrid or start the engine fresh"
            )
        problem = describe_sharding_mismatch(state.get("sharding"), self.shards.describe())
        problem = problem or describe_mismatch(state["config"], state["parameters"], self.config, self.params)
        if problem:
            raise ValueError(problem)
        for name, part in self._parts().items():
            part.load_state_dict(state[name])
        self.phase = None if state["phase"] is None else PredictPhase.from_state(state["phase"])
        self.steps_since_real = int(state["steps_since_real"])
        self.last_level = DivergenceLevel(int(state["last_level"]))
        self.last_predicted_loss = state["last_predicted_loss"]
        self.last_measured_loss = state["last_measured_loss"]
        self.max_confidence = float(state["max_confidence"])
        self._load_timing(state)
        self.meter.load_state_dict(state["peak_memory"])
        self.plan = None


def _finite_or_none(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None
