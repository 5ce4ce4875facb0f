"""Watching training for divergence: how far from normal each step looks.

Predicted steps apply updates nobody computed a gradient for, so a run can drift off quickly: cheap
signals are scored against the recent clean steps (`spike_detector.py`); what to do: `recovery.py`.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from .alarm import Alarm, DivergenceLevel, worst_level
from .spike_detector import LEVEL_STEPS, SpikeDetector, Thresholds
from .validation import check_float, check_int

logger = logging.getLogger(__name__)

__all__ = ["DivergenceLevel", "DivergenceMonitor"]

# Floors of the noise in z-scores (relative to |level|, and absolute): a flat loss would give infinite ones.
REL_STD_FLOOR = 1e-2
ABS_STD_FLOOR = 1e-6
HISTORY = 100  # the window of recent clean steps each signal is scored against
# z-scores in units of a value's distance from the level (the median of 5 adds pi/10 to the variance), so
# that the bands mean what they say on a clean run.
LEVEL_SPREAD = math.sqrt(1 + math.pi / (2 * LEVEL_STEPS))


def _as_float(name: str, value: float | None) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a float or None, got {value!r}") from exc


class DivergenceMonitor:
    """Scores each optimizer step against the recent clean steps: non-finite values (CRITICAL), the
    one-sided ``loss_z`` and ``prediction_error_z`` (> sigma CAUTION, > 1.5 WARNING, > 2 CRITICAL) and
    ``grad_ratio`` (> ``grad_spike_ratio`` WARNING, its square CRITICAL). The windows take only steps
    below WARNING, so a spike never poisons its baseline; `min_history` alarmed steps in a row are a new
    regime, learnt again, so a lasting change cannot force FULL steps for ever."""

    def __init__(
        self,
        sigma: float = 3.0,
        history: int = HISTORY,
        min_history: int = 10,
        grad_spike_ratio: float = 10.0,
    ) -> None:
        check_float("sigma", sigma, 0.0, math.inf, low_open=True, high_open=True)
        check_int("history", history, 2)
        check_int("min_history", min_history, 1)
        check_float("grad_spike_ratio", grad_spike_ratio, 1.0, math.inf, low_open=True, high_open=True)
        self.sigma, self.grad_spike_ratio = float(sigma), float(grad_spike_ratio)
        self.history = history
        self.min_history = min_history
        thresholds = Thresholds(
            history=history, min_history=min_history, rel_floor=REL_STD_FLOOR, abs_floor=ABS_STD_FLOOR
        )
        self._steps = SpikeDetector(thresholds)  # the losses and the gradient norms
        self._errors = SpikeDetector(thresholds)  # the loss forecast's errors
        self._alarm_streak = 0
        self.signals: dict[str, float] = {}  # the signals scored by the last `check`

    def check(
        self, loss: float | None, grad_norm: float | None = None, prediction_error: float | None = None
    ) -> list[Alarm]:
        """Score one step (``None`` = not measured this step), then fold it into the windows: one alarm per
        signal above NORMAL (the scored values stay in `signals` until the next check)."""
        loss = _as_float("loss", loss)
        grad_norm = _as_float("grad_norm", grad_norm)
        prediction_error = _as_float("prediction_error", prediction_error)
        self.signals = {}
        scored = (
            self._check_loss(loss),
            self._check_grad(grad_norm),
            self._check_prediction(prediction_error),
        )
        alarms = [alarm for alarm in scored if alarm is not None]
        level = worst_level(alarms)
        if level < DivergenceLevel.WARNING:
            self._alarm_streak = 0
            self._steps.add(_finite_or_none(loss), _finite_or_none(grad_norm))
            self._errors.add(_finite_or_none(prediction_error))
        else:
            self._alarm_streak += 1
            if self._alarm_streak >= self.min_history:
                self._rebaseline(self.signals)
        if alarms:
            logger.debug("divergence %s: %s", level.name, "; ".join(a.reason for a in alarms))
        return alarms

    def _check_loss(self, loss: float | None) -> Alarm | None:
        if loss is None:
            return None
        if not math.isfinite(loss):
            self.signals["loss_z"] = math.inf
            return Alarm(DivergenceLevel.CRITICAL, f"loss is non-finite ({loss})")
        if not self._steps.ready:
            return None
        return self._z_alarm("loss_z", self._steps.z(loss) / LEVEL_SPREAD, "loss z-score")

    def _check_grad(self, grad_norm: float | None) -> Alarm | None:
        if grad_norm is None:
            return None
        if not math.isfinite(grad_norm):
            self.signals["grad_ratio"] = math.inf
            return Alarm(DivergenceLevel.CRITICAL, f"grad norm is non-finite ({grad_norm})")
        ratio = self._steps.grad_ratio(grad_norm)
        if ratio is None:
            return None
        self.signals["grad_ratio"] = ratio
        if ratio > self.grad_spike_ratio**2:
            return Alarm(
                DivergenceLevel.CRITICAL, f"grad norm ratio {ratio:.1f} > {self.grad_spike_ratio**2:.1f}"
            )
        if ratio > self.grad_spike_ratio:
            return Alarm(
                DivergenceLevel.WARNING, f"grad norm ratio {ratio:.1f} > {self.grad_spike_ratio:.1f}"
            )
        return None

    def _check_prediction(self, error: float | None) -> Alarm | None:
        if error is None:
            return None
        if not math.isfinite(error):
            self.signals["prediction_error_z"] = math.inf
            return Alarm(DivergenceLevel.WARNING, f"prediction error is non-finite ({error})")
        if not self._errors.ready:
            return None
        return self._z_alarm(
            "prediction_error_z", self._errors.z(error) / LEVEL_SPREAD, "prediction error z-score"
        )

    def _z_alarm(self, signal: str, z: float, what: str) -> Alarm | None:
        """A z-score's alarm at the highest band it crossed (None: NORMAL); the score kept in `signals`."""
        self.signals[signal] = z
        for factor, level in _BANDS:
            if z > factor * self.sigma:
                return Alarm(level, f"{what} {z:.1f} > {factor * self.sigma:.1f}")
        return None

    def _rebaseline(self, signals: dict[str, float]) -> None:
        """Forget the windows that keep alarming (finite signals above the WARNING bound)."""
        bound = 1.5 * self.sigma
        forgets = {
            "loss_z": lambda: self._steps.clear(values=True, grad_norms=False),
            "grad_ratio": lambda: self._steps.clear(values=False, grad_norms=True),
            "prediction_error_z": self._errors.clear,
        }
        for key, forget in forgets.items():
            value = signals.get(key)
            limit = self.grad_spike_ratio if key == "grad_ratio" else bound
            if value is not None and math.isfinite(value) and value > limit:
                forget()
                logger.info(
                    "divergence: %s alarmed %d steps in a row; re-learning it", key, self._alarm_streak
                )
        self._alarm_streak = 0

    def loss_stats(self) -> tuple[float, float]:
        """The loss's recent level and the spread its z-scores are in units of; nan before data."""
        if not self._steps.losses:
            return math.nan, math.nan
        level, noise = self._steps.level_and_noise()
        return level, noise * LEVEL_SPREAD

    def state_dict(self) -> dict[str, Any]:
        """JSON-able windows (the thresholds are configuration and stay with the constructor)."""
        return {
            "steps": self._steps.state_dict(),
            "prediction_errors": self._errors.state_dict(),
            "alarm_streak": self._alarm_streak,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        missing = {"steps", "prediction_errors"} - set(state)
        if missing:
            raise ValueError(f"divergence monitor state lacks {sorted(missing)}; keys given: {sorted(state)}")
        self._steps.load_state_dict(state["steps"])
        self._errors.load_state_dict(state["prediction_errors"])
        self._alarm_streak = int(state.get("alarm_streak", 0))


_BANDS = ((2.0, DivergenceLevel.CRITICAL), (1.5, DivergenceLevel.WARNING), (1.0, DivergenceLevel.CAUTION))


def _finite_or_none(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None
