"""Predict phases: from the step that opens one to the step that closes it, and how it ended.

`PredictPhases` takes the rollback snapshot when one opens, gives a verdict at each CORRECT step (the
validated state the next rollback point), and closes it once with a `PhaseEnd` that rewards its horizon.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

from .alarm import Alarm, DivergenceLevel
from .bandit import HorizonBandit, default_arms, phase_reward
from .parts import EngineParts

# FULL-step losses whose batch-to-batch noise a predict phase is judged against.
REFERENCE_WINDOW = 17


class PhaseEnd(str, Enum):
    """How a predict phase ended."""

    COMPLETED = "completed"  # its CORRECT step validated it
    ROLLED_BACK = "rolled_back"  # its updates were undone (snapshot restored)
    ABANDONED = "abandoned"  # ended as failed, weights kept (rollback disabled, or nothing to blame)


@dataclass
class PredictPhase:
    """The open phase's bookkeeping: the loss level it must not regress from and its noise (fixed when it
    opens), the probe's loss at the last validated point, the losses of its checked predict steps."""

    opened_at: int
    horizon: int
    reference_loss: float
    reference_noise: float
    probe_before: float | None = None
    predicted: int = 0
    losses: list[float] = field(default_factory=list)

    def record_predicted(self, loss: float | None) -> None:
        self.predicted += 1
        if loss is not None:
            self.losses.append(loss)

    def verdict(self, loss: float | None, probe: Callable[[], float | None], sigma: float) -> Alarm | None:
        """A WARNING when the predicted updates since the last validated point failed, None if they held:
        the probe's loss must have fallen since `probe_before` (which moves here), else `regressed`."""
        measured = self.probe_before is not None and loss is not None and math.isfinite(loss)
        probe_after = probe() if measured else None
        if probe_after is not None and self.probe_before is not None:
            if not probe_after < self.probe_before:
                why = f"probe loss did not fall ({self.probe_before:.4f} -> {probe_after:.4f})"
                return Alarm(DivergenceLevel.WARNING, why)
            self.probe_before = probe_after
            return None
        if self.regressed(loss, sigma):
            return Alarm(DivergenceLevel.WARNING, "loss regressed over the predict phase")
        return None

    def regressed(self, loss: float | None, sigma: float) -> bool:
        """Did the mean of the phase's `n` measured losses exceed the reference by more than `sigma`
        standard errors (`reference_noise / sqrt(n)`)? A missing or non-finite loss counts as regressed."""
        if loss is None or not math.isfinite(loss):
            return True
        if not (math.isfinite(self.reference_loss) and math.isfinite(self.reference_noise)):
            return False
        measured = [x for x in self.losses if math.isfinite(x)] + [loss]
        mean = sum(measured) / len(measured)
        return mean > self.reference_loss + sigma * self.reference_noise / math.sqrt(len(measured))

    def reward(self, full_steps: int, how: PhaseEnd, skill: float) -> float:
        """What the phase earns the horizon bandit's arm it was given (see `bandit.phase_reward`)."""
        return phase_reward(self.predicted, full_steps, how is not PhaseEnd.COMPLETED, skill)

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> PredictPhase:
        return cls(**{**state, "losses": [float(x) for x in state["losses"]]})


class PredictPhases:
    """The open phase (`current`, None between phases) with its snapshot and probe readings, and the
    horizon bandit that learns which phase lengths pay."""

    def __init__(self, parts: EngineParts, probe: Callable[[], float] | None = None) -> None:
        self.parts = parts
        s = self.schedule = parts.config.schedule
        self.use_bandit = parts.config.use_bandit
        self.check_every = parts.config.check_every
        self._probe = probe
        arms = default_arms(s.min_predict_steps, s.max_predict_steps)
        self.bandit = HorizonBandit(arms, seed=parts.config.seed, exploration=0.3)
        self.current: PredictPhase | None = None

    def choose_horizon(self, cap: int) -> int:
        return self.bandit.select(cap) if self.use_bandit else min(cap, self.schedule.max_predict_steps)

    def open(self, forecast: Callable[[], float | None], fallback: Callable[[], tuple[float, float]]) -> None:
        """Start the phase the controller just entered, from a snapshot, judged against `reference_level`
        (or `fallback()`)."""
        with self.parts.timer.part("snapshot"):
            self.parts.guard.take_snapshot()
        full = [r.loss_actual for r in self.parts.store.recent(REFERENCE_WINDOW, phase="full")]
        with self.parts.timer.part("loss_forecaster"):
            mean, std = reference_level(forecast, full) or fallback()
        self.current = PredictPhase(
            opened_at=self.parts.controller.steps_decided,
            horizon=self.parts.controller.horizon,
            reference_loss=mean,
            reference_noise=std,
            probe_before=self.probe(),
        )
        self.parts.counters.add("predict_phases")

    def checked(self) -> bool:
        """Does the coming predicted step measure its loss (every `check_every`-th since a CORRECT step)?"""
        return self.check_every > 0 and self.parts.controller.predicted_since_correct % self.check_every == 0

    def record_predicted(self, loss: float | None) -> None:
        self.current.record_predicted(loss)

    def verdict(self, loss: float | None, sigma: float) -> Alarm | None:
        """The CORRECT step's verdict on the predicted updates since the last validated point."""
        return self.current.verdict(loss, self.probe, sigma)

    def validated(self, skill: float, widen: bool) -> None:
        """A CORRECT step held: its state is the next rollback point, or, at the last, the phase completed."""
        if self.parts.controller.predict_remaining > 0:
            with self.parts.timer.part("snapshot"):
                self.parts.guard.take_snapshot()
        else:
            self.end(PhaseEnd.COMPLETED, skill, widen)

    def end(self, how: PhaseEnd, skill: float = 0.0, widen: bool = True) -> None:
        """Close the open phase: reward the bandit, narrow or widen later horizons, free the snapshot."""
        phase, self.current = self.current, None
        if self.use_bandit and phase.horizon in self.bandit.arms:
            self.bandit.update(phase.horizon, phase.reward(self.schedule.full_steps, how, skill))
        self.parts.controller.end_phase(how is not PhaseEnd.COMPLETED, widen)
        self.parts.guard.drop_snapshot()

    def probe(self) -> float | None:
        """The probe's loss now (inf when not finite; None without a probe)."""
        if self._probe is None:
            return None
        self.parts.counters.add("probe_evaluations")
        with self.parts.timer.part("probe"):  # forwards the plain step does not run: the method's own cost
            value = float(self._probe())
        return value if math.isfinite(value) else math.inf

    def state_dict(self) -> dict[str, Any]:
        phase = None if self.current is None else self.current.state_dict()
        return {"bandit": self.bandit.state_dict(), "phase": phase}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.bandit.load_state_dict(state["bandit"])
        self.current = None if state["phase"] is None else PredictPhase.from_state(state["phase"])


# Lower bound of the loss noise a predict phase is judged against, relative to the loss.
REL_NOISE_FLOOR = 1e-3


def reference_level(
    forecast: Callable[[], float | None], full_losses: list[float | None]
) -> tuple[float, float] | None:
    """The forecaster's one-step `forecast()` and the median absolute change of recent FULL losses (None
    under 5 losses). Not the monitor's running statistics: on a falling loss their mean lags and their
    spread is mostly trend (phases that raised the loss by 1.5 passed, tests/faults)."""
    full = [x for x in full_losses if x is not None and math.isfinite(x)]
    mean = forecast() if len(full) >= 5 else None
    if mean is None:
        return None
    changes = sorted(abs(b - a) for a, b in zip(full, full[1:], strict=False))
    # median |x_t - x_{t-1}| of Gaussian noise = 0.954 sigma
    std = max(changes[len(changes) // 2] / 0.954, REL_NOISE_FLOOR * abs(mean))
    if math.isfinite(mean) and math.isfinite(std) and std > 0:
        return mean, std
    return None
