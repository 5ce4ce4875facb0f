"""Watching training for divergence: how far from normal each step looks.

Predicted steps apply updates nobody computed a gradient for, so a run can drift off quickly; several
cheap signals (loss, gradient norm, prediction error) are scored against their own running statistics
and the worst one decides the level. What to do about a level is decided in one place, `recovery.py`.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from .alarm import Alarm, DivergenceLevel, worst_level

logger = logging.getLogger(__name__)

__all__ = ["DivergenceLevel", "DivergenceMonitor"]

# Lower bound of the std used in z-scores, relative to |mean|: a perfectly flat loss would otherwise give
# infinite z-scores for the smallest wiggle. The absolute floor covers a mean of (almost) zero.
REL_STD_FLOOR = 1e-2
ABS_STD_FLOOR = 1e-6
# Lower bound of the running grad-norm mean used as the denominator of the spike ratio.
_GRAD_MEAN_FLOOR = 1e-12


class _RunningStat:
    """EMA mean/variance whose decay starts as a plain running average.

    The effective beta is ``min(beta, n / (n + 1))``: the first observations are averaged exactly
    (population mean and variance), so the baseline is not biased towards its first value, and the EMA
    takes over once it has seen about ``1 / (1 - beta)`` values.
    """

    def __init__(self) -> None:
        self.mean = 0.0
        self.var = 0.0
        self.count = 0

    def update(self, value: float, beta: float) -> None:
        if self.count == 0:
            self.mean, self.var = value, 0.0
        else:
            b = min(beta, self.count / (self.count + 1))
            delta = value - self.mean
            self.mean += (1.0 - b) * delta
            self.var = b * (self.var + (1.0 - b) * delta * delta)
        self.count += 1

    def std(self) -> float:
        """Std used for scoring, floored (see ``REL_STD_FLOOR``)."""
        return max(math.sqrt(self.var), REL_STD_FLOOR * abs(self.mean), ABS_STD_FLOOR)

    def z(self, value: float) -> float:
        return (value - self.mean) / self.std()

    def state_dict(self) -> dict[str, Any]:
        return {"mean": self.mean, "var": self.var, "count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.mean = float(state["mean"])
        self.var = float(state["var"])
        self.count = int(state["count"])


def _as_float(name: str, value: float | None) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a float or None, got {value!r}") from exc


class DivergenceMonitor:
    """Scores each optimizer step against running statistics of the steps before it.

    Signals (each only once it has ``min_history`` finite observations, except the non-finite check):

    * non-finite loss or grad norm: CRITICAL at once;
    * ``loss_z``: one-sided z-score of the loss (a rising loss is bad, a drop is fine);
    * ``grad_ratio``: grad norm over its running mean; > ``grad_spike_ratio`` is WARNING,
      > ``grad_spike_ratio ** 2`` CRITICAL;
    * ``prediction_error_z``: one-sided z-score of the signed ``actual - predicted loss`` (a loss better than
      forecast never alarms); a non-finite prediction
      error is WARNING (the predictor is broken, the weights need not be).

    z-scores map to levels as ``> sigma`` CAUTION, ``> 1.5 sigma`` WARNING, ``> 2 sigma`` CRITICAL. The
    statistics are only updated from steps below WARNING, so a spike never poisons the baseline it is
    judged against. A shift that persists for `min_history` alarmed steps in a row is a new regime, not a
    spike: the alarming statistics are re-learned from scratch, so a lasting change (a schedule restart,
    a loss model that is now biased) cannot lock training into forced FULL steps for ever.
    """

    def __init__(
        self,
        sigma: float = 3.0,
        ema_beta: float = 0.95,
        min_history: int = 10,
        grad_spike_ratio: float = 10.0,
    ) -> None:
        sigma = float(sigma)
        if not math.isfinite(sigma) or sigma <= 0:
            raise ValueError(f"sigma must be finite and > 0, got {sigma!r}")
        ema_beta = float(ema_beta)
        if not 0.0 < ema_beta < 1.0:
            raise ValueError(f"ema_beta must be in (0, 1), got {ema_beta!r}")
        if isinstance(min_history, bool) or not isinstance(min_history, int) or min_history < 1:
            raise ValueError(f"min_history must be an int >= 1, got {min_history!r}")
        grad_spike_ratio = float(grad_spike_ratio)
        if not math.isfinite(grad_spike_ratio) or grad_spike_ratio <= 1.0:
            raise ValueError(f"grad_spike_ratio must be finite and > 1, got {grad_spike_ratio!r}")
        self.sigma = sigma
        self.ema_beta = ema_beta
        self.min_history = min_history
        self.grad_spike_ratio = grad_spike_ratio
        self._loss = _RunningStat()
        self._grad = _RunningStat()
        self._pred = _RunningStat()
        self._alarm_streak = 0
        self.signals: dict[str, float] = {}  # the signals scored by the last `check`

    def _z_level(self, z: float) -> DivergenceLevel:
        if z > 2.0 * self.sigma:
            return DivergenceLevel.CRITICAL
        if z > 1.5 * self.sigma:
            return DivergenceLevel.WARNING
        if z > self.sigma:
            return DivergenceLevel.CAUTION
        return DivergenceLevel.NORMAL

    def check(
        self, loss: float | None, grad_norm: float | None = None, prediction_error: float | None = None
    ) -> list[Alarm]:
        """Score one step (``None`` = not measured this step), then fold it into the statistics: one alarm
        per signal above NORMAL (the scored values stay in `signals` until the next check)."""
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
            for stat, value in ((self._loss, loss), (self._grad, grad_norm), (self._pred, prediction_error)):
                if value is not None and math.isfinite(value):
                    stat.update(value, self.ema_beta)
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
        if self._loss.count < self.min_history:
            return None
        return self._z_alarm("loss_z", self._loss.z(loss), "loss z-score")

    def _check_grad(self, grad_norm: float | None) -> Alarm | None:
        if grad_norm is None:
            return None
        if not math.isfinite(grad_norm):
            self.signals["grad_ratio"] = math.inf
            return Alarm(DivergenceLevel.CRITICAL, f"grad norm is non-finite ({grad_norm})")
        if self._grad.count < self.min_history:
            return None
        ratio = grad_norm / max(self._grad.mean, _GRAD_MEAN_FLOOR)
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
        if self._pred.count < self.min_history:
            return None
        return self._z_alarm("prediction_error_z", self._pred.z(error), "prediction error z-score")

    def _z_alarm(self, signal: str, z: float, what: str) -> Alarm | None:
        """A z-score's alarm at the level it reached (None: NORMAL); the score kept in `signals`."""
        self.signals[signal] = z
        level = self._z_level(z)
        return (
            Alarm(level, f"{what} {z:.1f} > {self._bound(level):.1f}")
            if level > DivergenceLevel.NORMAL
            else None
        )

    def _bound(self, level: DivergenceLevel) -> float:
        """The z threshold that ``level`` crossed (for the reason text)."""
        return {
            DivergenceLevel.NORMAL: 0.0,
            DivergenceLevel.CAUTION: self.sigma,
            DivergenceLevel.WARNING: 1.5 * self.sigma,
            DivergenceLevel.CRITICAL: 2.0 * self.sigma,
        }[level]

    def _rebaseline(self, signals: dict[str, float]) -> None:
        """Forget the statistics that keep alarming (finite signals above the WARNING bound)."""
        bound = 1.5 * self.sigma
        attributes = {"loss_z": "_loss", "grad_ratio": "_grad", "prediction_error_z": "_pred"}
        for key, attribute in attributes.items():
            value = signals.get(key)
            limit = self.grad_spike_ratio if key == "grad_ratio" else bound
            if value is not None and math.isfinite(value) and value > limit:
                setattr(self, attribute, _RunningStat())
                logger.info(
                    "divergence: %s alarmed %d steps in a row; re-learning it", key, self._alarm_streak
                )
        self._alarm_streak = 0

    def loss_stats(self) -> tuple[float, float]:
        """Running mean and std of the loss (std as used for z-scores, floor included); nan before data."""
        if self._loss.count == 0:
            return math.nan, math.nan
        return self._loss.mean, self._loss.std()

    def state_dict(self) -> dict[str, Any]:
        """JSON-able running statistics (the thresholds are configuration and stay with the constructor)."""
        return {
            "loss": self._loss.state_dict(),
            "grad_norm": self._grad.state_dict(),
            "prediction_error": self._pred.state_dict(),
            "alarm_streak": self._alarm_streak,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        missing = {"loss", "grad_norm", "prediction_error"} - set(state)
        if missing:
            raise ValueError(f"divergence monitor state lacks {sorted(missing)}; keys given: {sorted(state)}")
        self._loss.load_state_dict(state["loss"])
        self._grad.load_state_dict(state["grad_norm"])
        self._pred.load_state_dict(state["prediction_error"])
        self._alarm_streak = int(state.get("alarm_streak", 0))
