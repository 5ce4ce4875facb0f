"""HybridEngine: the whole algorithm behind two calls per optimizer step.

    plan = engine.begin_step()                  # which phase, and whether to measure the loss
    ... caller runs forward(+backward) for the step's micro-batches ...
    engine.finish_step(loss, grad_norm, lr, optimizer_step)   # where the real step would happen

The caller (a Trainer, or any plain PyTorch loop) never decides anything itself; the engine never
reaches into the caller except through `optimizer_step`. Everything it decides is derived from
scalars that are identical on every rank (the caller all-reduces the loss), so no rank drifts.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from .bandit import HorizonBandit, default_arms, phase_reward
from .divergence import DivergenceLevel, DivergenceMonitor, DivergenceReport
from .dynamics import LossDynamics
from .guard import ParameterGuard
from .phases import Phase, PhaseController, PhaseSchedule
from .predictor import build_predictor, delta_dot_products, resolve_predictor_name
from .residuals import Corrector, Residual, ResidualStore
from .state import FORMAT_VERSION

logger = logging.getLogger(__name__)

# Cost of one step in forward-pass units (forward 1, backward 2): the machine-independent compute model.
FULL_STEP_COST = 3.0
CHECKED_PREDICT_COST = 1.0
# Lower bound of the loss noise a predict phase is judged against, relative to the loss.
REL_NOISE_FLOOR = 1e-3


@dataclass(frozen=True)
class EngineConfig:
    schedule: PhaseSchedule = field(default_factory=PhaseSchedule)
    predictor: str = "ema"  # or "auto": see predictor.resolve_predictor_name
    predictor_kwargs: dict[str, Any] = field(default_factory=dict)
    check_every: int = 1
    max_delta: float = 0.05
    rollback: bool = True
    divergence_sigma: float = 3.0
    snapshot_device: str = "same"
    seed: int = 0
    use_bandit: bool = True
    probe_cost: float = 0.0  # forward units of one probe evaluation (0: no probe)
    dormant_every: int = 8  # while dormant, observe/score the real update every n-th FULL step

    def fingerprint(self) -> dict[str, Any]:
        """What must match for a saved engine state to mean anything to this one."""
        return {**asdict(self), "schedule": self.schedule.fingerprint()}


@dataclass(frozen=True)
class StepPlan:
    phase: Phase
    measure_loss: bool


@dataclass(frozen=True)
class StepOutcome:
    phase: Phase
    loss: float | None
    applied_update: bool
    rolled_back: bool
    level: DivergenceLevel
    reasons: tuple[str, ...] = ()


class HybridEngine:
    """Phase controller, predictor, loss dynamics, residuals, divergence monitor and guard, wired."""

    def __init__(
        self,
        params: Mapping[str, torch.Tensor],
        config: EngineConfig | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        probe: Callable[[], float] | None = None,
    ) -> None:
        """`probe()` returns the loss of fixed held-out batches (identical on every rank); with it, a predict
        phase is kept only if that loss fell from the phase's start to its end (a line search along the
        predicted path), instead of the noisier training-loss regression test."""
        self.config = config or EngineConfig()
        if not params:
            raise ValueError("HybridEngine needs at least one trainable parameter; the model has none")
        self.params = dict(params)
        self.probe = probe
        s = self.config.schedule
        self.controller = PhaseController(s)
        self.bandit = HorizonBandit(
            default_arms(s.min_predict_steps, s.max_predict_steps), seed=self.config.seed, exploration=0.3
        )
        self.predictor_name = resolve_predictor_name(self.config.predictor, optimizer)
        self.predictor = build_predictor(
            self.predictor_name, params=self.params, optimizer=optimizer, **self.config.predictor_kwargs
        )
        self.dynamics = LossDynamics(seed=self.config.seed, train_every=4)  # ~1 ms a step on average
        self.monitor = DivergenceMonitor(sigma=self.config.divergence_sigma)
        self.store = ResidualStore()
        self.corrector = Corrector()
        self.guard = ParameterGuard(self.params, self.config.snapshot_device)
        self.last_theta = {name: p.detach().float().clone() for name, p in self.params.items()}
        self.counts: Counter[str] = Counter()
        self.plan: StepPlan | None = None
        self.steps_since_real = 0
        self.steps_since_sync = 0
        self.phase_state: dict[str, Any] = {}
        self.last_report: DivergenceReport | None = None
        self.last_predicted_loss: float | None = None
        self.last_measured_loss: float | None = None
        self._forced_at = -1  # step whose forced FULL is already counted

    # ---- per step -------------------------------------------------------------------------------

    def begin_step(self) -> StepPlan:
        """Decide the phase of the next optimizer step (call once per step, on every rank)."""
        was_predicting = self.controller.in_predict_phase
        phase = self.controller.decide(self.confidence(), self.predictor.observed, self._choose_horizon)
        if phase is Phase.PREDICT and not was_predicting:
            self._open_predict_phase()
        self.last_predicted_loss = self._forecast_next_loss()
        measure = phase.runs_backward or self._is_checked_predict_step()
        self.plan = StepPlan(phase, measure)
        self.counts[f"steps_{phase.value}"] += 1
        return self.plan

    def finish_step(
        self,
        loss: float | None,
        grad_norm: float | None,
        learning_rate: float,
        optimizer_step: Callable[[], None],
        skip_nonfinite_step: bool = True,
    ) -> StepOutcome:
        """Run the step's update: the real optimizer step, or the predicted delta.

        `skip_nonfinite_step=False` is for callers whose optimizer already skips non-finite
        gradients (a fp16 GradScaler) and must be called on every real step.
        """
        if self.plan is None:
            raise RuntimeError("finish_step() called without begin_step()")
        plan, self.plan = self.plan, None
        if plan.phase.runs_backward:
            return self._real_step(
                plan.phase, loss, grad_norm, learning_rate, optimizer_step, skip_nonfinite_step
            )
        return self._predict_step(loss if plan.measure_loss else None, learning_rate)

    # ---- real steps (WARMUP, FULL, CORRECT) ----------------------------------------------------

    def _real_step(
        self,
        phase: Phase,
        loss: float | None,
        grad_norm: float | None,
        lr: float,
        optimizer_step: Callable[[], None],
        skip_nonfinite: bool,
    ) -> StepOutcome:
        self.counts["backward_run"] += 1
        reasons: list[str] = []
        rolled_back = False
        finite = loss is not None and math.isfinite(loss) and (grad_norm is None or math.isfinite(grad_norm))
        if phase is Phase.CORRECT and self.config.rollback and self._regressed(loss):
            self._rollback()
            rolled_back = True
            reasons.append("loss regressed over the predict phase")
        elif phase is Phase.CORRECT and self.phase_state and self.phase_state.get("probe_before") is not None:
            after = self._probe()
            if self.config.rollback and not after < self.phase_state["probe_before"]:
                self._rollback()
                rolled_back = True
                reasons.append(
                    f"probe loss did not fall ({self.phase_state['probe_before']:.4f} -> {after:.4f})"
                )
            else:
                self.phase_state["probe_before"] = after  # the next stretch of this phase starts here
        if not finite:
            self.counts["nonfinite_real_steps"] += 1
            reasons.append(f"non-finite loss/grad norm ({loss}, {grad_norm})")
            if not skip_nonfinite:
                optimizer_step()
                self._sync_last_theta()
            # any CORRECT step, the closing one too: no usable gradient validated the predicted updates
            in_phase = self.controller.in_predict_phase or phase is Phase.CORRECT
            if in_phase and self.config.rollback and not rolled_back and self.guard.has_snapshot:
                self._rollback()
                rolled_back = True
            report = self.monitor.check(loss, grad_norm)
            self._close_predict_phase(rolled_back=True, skill=0.0)
            self._force_full()
            self.steps_since_real = 0
            return StepOutcome(phase, loss, False, rolled_back, report.level, tuple(reasons + report.reasons))

        sparse = (phase is Phase.FULL and self._dormant()) or (phase is Phase.WARMUP and self._early_warmup())
        if sparse and self.steps_since_sync + 1 < self.config.dormant_every:
            optimizer_step()
            self.steps_since_sync += 1
            return self._after_real_step(phase, loss, grad_norm, lr, None, rolled_back, reasons)
        steps_ahead = self.steps_since_real + 1
        scored = phase is not Phase.WARMUP  # warmup only observes: no prediction to score, no cost
        predicted = self._safe_predict(steps_ahead) if scored else None
        optimizer_step()
        delta = self._sync_last_theta()
        residual = None
        if scored:
            pd, pp, dd = delta_dot_products(predicted, delta)
            if not (math.isfinite(pd) and math.isfinite(pp)):
                logger.warning("predictor %r produced a non-finite update; resetting it", self.predictor_name)
                self.counts["refused_updates"] += 1
                self.predictor.reset()
                pd = pp = 0.0
            residual = Residual(
                self.controller.steps_decided,
                phase.value,
                steps_ahead,
                pd,
                pp,
                dd,
                loss,
                self.last_predicted_loss,
            )
            self.store.add(residual)
            self.corrector.update(residual)
        del predicted
        self.predictor.observe(delta)
        return self._after_real_step(phase, loss, grad_norm, lr, residual, rolled_back, reasons)

    def _after_real_step(
        self,
        phase: Phase,
        loss: float,
        grad_norm: float | None,
        lr: float,
        residual: Residual | None,
        rolled_back: bool,
        reasons: list[str],
    ) -> StepOutcome:
        self.steps_since_real = 0
        self.dynamics.observe(loss, lr, grad_norm, phase.index)
        report = self.monitor.check(loss, grad_norm, self._prediction_error(loss))
        self.last_measured_loss = loss
        if self._react(report, may_roll_back=phase is Phase.CORRECT and not rolled_back):
            rolled_back = True
            reasons.append("rolled back: divergence at the CORRECT step")
        if phase is Phase.CORRECT and residual is not None:
            self._after_correct(residual, rolled_back)
        return StepOutcome(phase, loss, True, rolled_back, report.level, tuple(reasons + report.reasons))

    def _after_correct(self, residual: Residual, rolled_back: bool) -> None:
        if rolled_back:
            # A rolled-back phase ends here, even at an intermediate CORRECT step: its snapshot and
            # phase state are dropped below, so the controller must not go on predicting.
            self.controller.predict_remaining = 0
        if rolled_back or self.controller.predict_remaining == 0:
            self._close_predict_phase(rolled_back, residual.skill(self.corrector.scale))
        else:
            self.guard.take_snapshot()  # intermediate CORRECT: the validated state is the new rollback point

    # ---- predicted steps ------------------------------------------------------------------------

    def _predict_step(self, loss: float | None, lr: float) -> StepOutcome:
        self.counts["backward_skipped"] += 1
        self.counts["predict_checked" if loss is not None else "predict_blind"] += 1
        self.phase_state["predicted"] += 1
        report = None
        if loss is not None:
            report = self.monitor.check(loss, None, self._prediction_error(loss))
            self.phase_state["losses"].append(loss)
            self.last_measured_loss = loss
            if math.isfinite(loss):
                self.dynamics.observe(loss, lr, None, Phase.PREDICT.index)
            if report.level >= DivergenceLevel.WARNING:
                rolled_back = report.level >= DivergenceLevel.CRITICAL and self.config.rollback
                if rolled_back:
                    self._rollback()
                self._close_predict_phase(rolled_back=True, skill=0.0)
                self._force_full()
                return StepOutcome(
                    Phase.PREDICT, loss, False, rolled_back, report.level, tuple(report.reasons)
                )
            if report.level is DivergenceLevel.CAUTION:
                self.controller.shorten()
        level = DivergenceLevel.NORMAL if report is None else report.level
        reasons = () if report is None else tuple(report.reasons)
        steps_ahead = self.steps_since_real + 1
        self.steps_since_real += 1
        errors = self.counts["predictor_errors"]
        predicted = self._safe_predict(steps_ahead)
        if self.counts["predictor_errors"] != errors:
            # the predictor raised mid-phase: refuse like a non-finite prediction (roll back, close the
            # phase and free its snapshot) instead of leaving the open phase's state behind
            return self._refuse(loss, "the predictor failed (raised, or a wrongly shaped update)")
        if predicted is None:
            return StepOutcome(Phase.PREDICT, loss, False, False, level, reasons)
        scaled = {name: t * self.corrector.scale for name, t in predicted.items()}
        result, applied = self.guard.apply(scaled, self.config.max_delta)
        if not result.applied:
            return self._refuse(loss, result.reason)
        self.counts["clipped_tensors"] += result.clipped_tensors
        for name, d in applied.items():
            self.last_theta[name].add_(d)
        return StepOutcome(Phase.PREDICT, loss, True, False, level, reasons)

    def _safe_predict(self, steps_ahead: int) -> dict[str, torch.Tensor] | None:
        """A predictor that raises, or returns a tensor shaped unlike its parameter (which would crash or
        silently broadcast in a real step's scoring), is treated like one that returned garbage: reset."""
        try:
            predicted = self.predictor.predict(steps_ahead)
            _check_prediction(predicted, self.params)
            return predicted
        except Exception as exc:  # noqa: BLE001 - any predictor failure must end in a safe fallback
            logger.warning("predictor %r raised %r; resetting it", self.predictor_name, exc)
            self.counts["predictor_errors"] += 1
            self.predictor.reset()
            if self.controller.in_predict_phase:
                self._force_full()
            return None

    def _refuse(self, loss: float | None, reason: str) -> StepOutcome:
        logger.warning("refused a predicted update: %s; rolling back and training fully", reason)
        self.counts["refused_updates"] += 1
        self.predictor.reset()
        rolled_back = self.config.rollback
        if rolled_back:
            self._rollback()
        self._close_predict_phase(rolled_back=True, skill=0.0)
        self._force_full()
        return StepOutcome(Phase.PREDICT, loss, False, rolled_back, DivergenceLevel.CRITICAL, (reason,))

    def _force_full(self) -> None:
        """The recovery every divergence and refusal shares; counted once per step, whatever forced it."""
        if self._forced_at != self.controller.steps_decided:
            self._forced_at = self.controller.steps_decided
            self.counts["forced_full"] += 1
        self.controller.force_full(self.config.schedule.full_steps)

    # ---- phase bookkeeping ----------------------------------------------------------------------

    def _choose_horizon(self, cap: int) -> int:
        s = self.config.schedule
        return self.bandit.select(cap) if self.config.use_bandit else min(cap, s.max_predict_steps)

    def _open_predict_phase(self) -> None:
        self.guard.take_snapshot()
        mean, std = self._phase_reference()
        horizon = self.controller.horizon
        self.phase_state = {
            "horizon": horizon,
            "predicted": 0,
            "losses": [],
            "pre_mean": mean,
            "pre_std": std,
            "probe_before": self._probe(),
        }
        self.counts["predict_phases"] += 1

    def _phase_reference(self) -> tuple[float, float]:
        """Loss level a predict phase must not regress from (the loss model's one-step forecast) and the
        batch-to-batch noise of FULL-step losses (robust: median absolute change).

        Not the monitor's running statistics: on a falling loss their mean lags and their spread is mostly
        trend, and the loss model's error grows with every spike it sees; with either, phases that raised
        the loss by 1.5 passed (tests/faults, a confidently wrong predictor).
        """
        full = [r.loss_actual for r in self.store.recent(17, phase="full")]
        full = [x for x in full if x is not None and math.isfinite(x)]
        if self.dynamics.num_observed and len(full) >= 5:
            mean = self.dynamics.forecast(1).mean[0]
            changes = sorted(abs(b - a) for a, b in zip(full, full[1:], strict=False))
            # median |x_t - x_{t-1}| of Gaussian noise = 0.954 sigma
            std = max(changes[len(changes) // 2] / 0.954, REL_NOISE_FLOOR * abs(mean))
            if math.isfinite(mean) and math.isfinite(std) and std > 0:
                return mean, std
        return self.monitor.loss_stats()

    def _close_predict_phase(self, rolled_back: bool, skill: float) -> None:
        if not self.phase_state:
            return
        predicted = self.phase_state["predicted"]
        if self.config.use_bandit and self.phase_state["horizon"] in self.bandit.arms:
            reward = phase_reward(predicted, self.config.schedule.full_steps, rolled_back, skill)
            self.bandit.update(self.phase_state["horizon"], reward)
        if rolled_back:
            self.controller.shorten()
        else:
            self.controller.relax()
        self.guard.drop_snapshot()
        self.phase_state = {}

    def _forecast_next_loss(self) -> float | None:
        """The loss model's one-step forecast (None before it has seen a loss)."""
        value = self.dynamics.next_loss()
        return None if value is None else _finite_or_none(value)

    def _prediction_error(self, loss: float) -> float | None:
        """Signed (actual - forecast): the monitor scores it one-sided, so a better loss never alarms."""
        if self.last_predicted_loss is None or not math.isfinite(loss):
            return None
        return loss - self.last_predicted_loss

    def _probe(self) -> float | None:
        if self.probe is None:
            return None
        self.counts["probe_evaluations"] += 1
        value = float(self.probe())
        return value if math.isfinite(value) else math.inf

    def _regressed(self, loss: float | None) -> bool:
        """Did the loss over the phase (checked predict steps + this one) rise past tolerance?

        With a probe the held-out comparison decides instead (same batches before and after: no batch noise).
        """
        if loss is None or not math.isfinite(loss):
            return True
        if self.probe is not None:
            return False
        pre_mean, pre_std = self.phase_state.get("pre_mean"), self.phase_state.get("pre_std")
        if pre_mean is None or not math.isfinite(pre_mean) or not math.isfinite(pre_std):
            return False
        measured = [x for x in self.phase_state["losses"] if math.isfinite(x)] + [loss]
        mean = sum(measured) / len(measured)
        return mean > pre_mean + self.config.divergence_sigma * pre_std / math.sqrt(len(measured))

    def _rollback(self) -> None:
        if not self.guard.has_snapshot:
            return
        self.guard.restore_snapshot()
        for name, buf in self.last_theta.items():
            buf.copy_(self.guard.snapshot[name])
        self.corrector.penalize()
        self.counts["rollbacks"] += 1
        logger.info("rolled back to the snapshot taken at the start of the predict phase")

    def _react(self, report: DivergenceReport, may_roll_back: bool) -> bool:
        """Apply the report's recovery action; True if it rolled the parameters back."""
        self.last_report = report
        rolled_back = False
        if report.level >= DivergenceLevel.WARNING:
            # at a CORRECT step the phase it closes is the suspect: a WARNING already fails it
            if may_roll_back and self.config.rollback and self.guard.has_snapshot:
                self._rollback()
                rolled_back = True
            self._close_predict_phase(rolled_back=True, skill=0.0)
            self._force_full()
        elif report.level is DivergenceLevel.CAUTION:
            self.controller.shorten()
        return rolled_back

    @torch.no_grad()
    def _sync_last_theta(self) -> dict[str, torch.Tensor]:
        """Real update per step since the last sync (fp32; averaged over skipped syncs while dormant),
        and remember the new parameters."""
        self.guard.forget_compensation()
        steps = self.steps_since_sync + 1
        delta = {}
        for name, p in self.params.items():
            current = p.detach().float()
            delta[name] = current - self.last_theta[name]
            if steps > 1:
                delta[name].div_(steps)
            self.last_theta[name].copy_(current)
        self.steps_since_sync = 0
        return delta

    def _early_warmup(self) -> bool:
        """Warmup only feeds the predictor; its dense history is needed just before the first phase."""
        remaining = self.config.schedule.warmup_steps - self.controller.steps_decided
        return remaining > 2 * self.config.schedule.min_history

    def _dormant(self) -> bool:
        """Predictions have stayed far from useful: watch the real updates only every n-th step.

        Observing costs several passes over every trainable parameter per step (~15% of a CPU step when
        fully fine-tuning a 22M-parameter model); while the measured confidence sits under half the
        threshold, an averaged update every `dormant_every` steps keeps the predictor and its score alive
        at a fraction of that. Confidence above half the threshold wakes it up.
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

    # ---- what the outside sees ------------------------------------------------------------------

    def confidence(self) -> float:
        """Measured: mean recent skill of the predictor, capped by the loss model's calibration."""
        confidence = self.corrector.confidence(self.store)
        if self.dynamics.trusted:
            confidence = min(confidence, self._loss_calibration())
        return confidence

    def _loss_calibration(self) -> float:
        """Share of recent predicted-step losses inside the loss model's forecast (1 with none yet)."""
        recent = [r for r in self.store.recent(32) if r.loss_error is not None and r.phase == "correct"]
        if not recent:
            return 1.0
        _, std = self.monitor.loss_stats()
        tolerance = 2.0 * std if math.isfinite(std) and std > 0 else float("inf")
        return sum(abs(r.loss_error) <= tolerance for r in recent) / len(recent)

    def compute_units(self) -> float:
        """Forward-pass units spent: 3 per real step, 1 per checked predicted step, the probe's cost."""
        return (
            self.counts["backward_run"] * FULL_STEP_COST
            + self.counts["predict_checked"] * CHECKED_PREDICT_COST
            + self.counts["probe_evaluations"] * self.config.probe_cost
        )

    def stats(self) -> dict[str, Any]:
        """Plain counters (what `HybridHFTrainer.hybrid_stats()` returns)."""
        steps = {p.value: self.counts[f"steps_{p.value}"] for p in Phase}
        total = sum(steps.values())
        run, skipped = self.counts["backward_run"], self.counts["backward_skipped"]
        cost = self.compute_units()
        return {
            "steps": total,
            "steps_per_phase": steps,
            "backward_run": run,
            "backward_skipped": skipped,
            "backward_skipped_fraction": skipped / max(run + skipped, 1),
            "predict_checked": self.counts["predict_checked"],
            "predict_blind": self.counts["predict_blind"],
            "predict_phases": self.counts["predict_phases"],
            "rollbacks": self.counts["rollbacks"],
            "forced_full": self.counts["forced_full"],
            "refused_updates": self.counts["refused_updates"],
            "predictor_errors": self.counts["predictor_errors"],
            "nonfinite_real_steps": self.counts["nonfinite_real_steps"],
            "clipped_tensors": self.counts["clipped_tensors"],
            "probe_evaluations": self.counts["probe_evaluations"],
            "compute_units": cost,
            "compute_saved_fraction": 1.0 - cost / max((run + skipped) * FULL_STEP_COST, 1.0),
            "predictor": self.predictor_name,
            "predictor_bytes": self.predictor.nbytes(),
            "engine_bytes": self.nbytes(),
        }

    def metrics(self) -> dict[str, float]:
        """Scalars for the training log (keys without the `hybrid/` prefix)."""
        stats = self.stats()
        recent = self.store.recent(16)
        errors = self.dynamics.errors()
        out: dict[str, float] = {
            "phase": float(self.controller.phase.index if self.controller.phase else 0),
            "confidence": self.confidence(),
            "horizon": float(self.controller.horizon),
            "horizon_cap": float(self.controller.horizon_cap),
            "corrector_scale": self.corrector.scale,
            "backward_run": float(stats["backward_run"]),
            "backward_skipped": float(stats["backward_skipped"]),
            "predict_phases": float(stats["predict_phases"]),
            "backward_skipped_fraction": stats["backward_skipped_fraction"],
            "compute_saved_fraction": stats["compute_saved_fraction"],
            "rollbacks": float(stats["rollbacks"]),
            "divergence_level": float(self.last_report.level if self.last_report else 0),
            "predictor_bytes": float(stats["predictor_bytes"]),
            "engine_bytes": float(stats["engine_bytes"]),
            "dynamics_trusted": float(self.dynamics.trusted),
            "dynamics_mae": errors["gru_mae"],
            "dynamics_baseline_mae": min(errors["last_value_mae"], errors["ema_mae"]),
        }
        for phase, count in stats["steps_per_phase"].items():
            out[f"steps_{phase}"] = float(count)
        if recent:
            out["update_cosine"] = sum(r.cosine for r in recent) / len(recent)
            out["update_norm_ratio"] = sum(r.norm_ratio for r in recent) / len(recent)
            out["update_skill"] = sum(r.skill(self.corrector.scale) for r in recent) / len(recent)
            # ||s*p - d|| (absolute and relative to ||d||): how far the scaled guess was from the real update
            s = self.corrector.scale
            norms = [math.sqrt(max(s * s * r.pp - 2.0 * s * r.pd + r.dd, 0.0)) for r in recent]
            out["residual_norm"] = sum(norms) / len(norms)
            relative = [math.sqrt(max(1.0 - r.skill(s), 0.0)) for r in recent if r.dd > 0]
            if relative:
                out["residual_rel_norm"] = sum(relative) / len(relative)
        if self.last_predicted_loss is not None:
            out["predicted_loss"] = self.last_predicted_loss
        if self.last_measured_loss is not None:
            out["measured_loss"] = self.last_measured_loss
        return {k: float(v) for k, v in out.items() if v is not None and math.isfinite(float(v))}

    # ---- checkpointing ---------------------------------------------------------------------------

    def parameter_fingerprint(self) -> dict[str, list[int]]:
        return {name: list(p.shape) for name, p in self.params.items()}

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly, mid-phase included (tensors and plain values)."""
        if self.plan is not None:
            raise RuntimeError("cannot save the engine in the middle of an optimizer step")
        return {
            "format_version": FORMAT_VERSION,
            "config": self.config.fingerprint(),
            "parameters": self.parameter_fingerprint(),
            "controller": self.controller.state_dict(),
            "bandit": self.bandit.state_dict(),
            "predictor": self.predictor.state_dict(),
            "dynamics": self.dynamics.state_dict(),
            "monitor": self.monitor.state_dict(),
            "store": self.store.state_dict(),
            "corrector": self.corrector.state_dict(),
            "snapshot": dict(self.guard.snapshot),
            "compensation": dict(self.guard.compensation),
            "last_theta": dict(self.last_theta),
            "counts": dict(self.counts),
            "steps_since_real": self.steps_since_real,
            "steps_since_sync": self.steps_since_sync,
            "phase_state": self.phase_state,
            "last_predicted_loss": self.last_predicted_loss,
            "last_measured_loss": self.last_measured_loss,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a saved engine; refuses a state that belongs to another configuration or model."""
        version = state.get("format_version")
        if version != FORMAT_VERSION:
            raise ValueError(
                f"hybrid state format version {version!r} is not supported by this hf_hybrid "
                f"(supports {FORMAT_VERSION}); upgrade hf_hybrid or start the engine fresh"
            )
        problem = describe_mismatch(state["config"], state["parameters"], self.config, self.params)
        if problem:
            raise ValueError(problem)
        self.controller.load_state_dict(state["controller"])
        self.bandit.load_state_dict(state["bandit"])
        self.predictor.load_state_dict(state["predictor"])
        self.dynamics.load_state_dict(state["dynamics"])
        self.monitor.load_state_dict(state["monitor"])
        self.store.load_state_dict(state["store"])
        self.corrector.load_state_dict(state["corrector"])
        self.guard.load_buffers(state["snapshot"], state["compensation"])
        for name, buf in self.last_theta.items():
            buf.copy_(state["last_theta"][name])
        self.counts = Counter(state["counts"])
        self.steps_since_real = int(state["steps_since_real"])
        self.steps_since_sync = int(state["steps_since_sync"])
        self.phase_state = dict(state["phase_state"])
        self.last_predicted_loss = state["last_predicted_loss"]
        self.last_measured_loss = state["last_measured_loss"]
        self.plan = None

    def nbytes(self) -> int:
        theta = sum(t.numel() * t.element_size() for t in self.last_theta.values())
        return theta + self.predictor.nbytes() + self.guard.nbytes() + self.dynamics.nbytes()


def describe_mismatch(
    saved_config: Mapping[str, Any],
    saved_parameters: Mapping[str, list[int]],
    config: EngineConfig,
    params: Mapping[str, torch.Tensor],
) -> str | None:
    """Why a saved engine state cannot be used with this configuration and these parameters (None: it can)."""
    now = config.fingerprint()
    if dict(saved_config) != now:
        diff = {k: (saved_config.get(k), v) for k, v in now.items() if saved_config.get(k) != v}
        return f"hybrid configuration differs from the checkpoint's (saved, now): {diff}"
    shapes = {name: list(p.shape) for name, p in params.items()}
    if dict(saved_parameters) != shapes:
        missing = sorted(set(saved_parameters) - set(shapes))[:3]
        extra = sorted(set(shapes) - set(saved_parameters))[:3]
        common = set(shapes) & set(saved_parameters)
        reshaped = sorted(k for k in common if list(saved_parameters[k]) != shapes[k])[:3]
        return (
            "trainable parameters differ from the checkpoint's: "
            f"only in checkpoint {missing}, only in model {extra}, different shapes {reshaped}"
        )
    return None


def _check_prediction(
    predicted: Mapping[str, torch.Tensor] | None, params: Mapping[str, torch.Tensor]
) -> None:
    """Raise if a predicted update names an unknown parameter or has another shape than its parameter."""
    for name, delta in (predicted or {}).items():
        if name not in params:
            raise ValueError(f"predicted update for unknown parameter {name!r}")
        if delta.shape != params[name].shape:
            raise ValueError(
                f"predicted update for {name!r} has shape {tuple(delta.shape)}, "
                f"the parameter {tuple(params[name].shape)}"
            )


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None
