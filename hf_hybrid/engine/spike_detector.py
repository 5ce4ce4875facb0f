"""The engine's one spike detector: is a value far out against a window of recent clean ones?

The spike guard and the divergence monitor each keep their own windows (each its own idea of a clean
step). The *level* is the median of the last few values, the *noise* the robust spread of step-to-step
differences: a running variance would be inflated for hundreds of steps by a fine-tune's steep early
descent and hide a real spike. The guard's tests: a *sudden* spike and a *lasting* shift.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Any

LEVEL_STEPS = 5  # the guard's level: the median of this many recent clean values
# A lasting shift: the median of the last SHIFT_STEPS losses SHIFT_Z noise units and SHIFT_RISE of the level
# above the SHIFT_BASE steps before them (~5e-6 a step by chance; an lr x30 burst on the tiny GPT-2 raised
# the loss 4 noise units for six steps without any single step passing the one-step test).
SHIFT_STEPS, SHIFT_BASE, SHIFT_Z, SHIFT_RISE = 3, 20, 3.0, 0.1
ROBUST_SIGMA = 1.4826  # the median absolute deviation of a Gaussian, in standard deviations


@dataclass(frozen=True)
class Thresholds:
    """What counts as far out (see `SpikeGuardConfig`); the noise is floored at `rel_floor` of the level
    (a flat loss would give infinite z-scores) and `abs_floor`."""

    history: int = 50
    min_history: int = 20
    max_z: float = 6.0
    min_rise: float = 0.5
    min_rise_after_spike: float = 0.2
    max_grad_ratio: float = 100.0
    rel_floor: float = 1e-3
    abs_floor: float = 1e-12


class SpikeDetector:
    """A window of recent clean values (with their steps) and gradient norms, its robust level and noise
    (computed once per change of the window), and the sudden and lasting tests."""

    def __init__(self, thresholds: Thresholds | None = None) -> None:
        self.thresholds = thresholds or Thresholds()
        history = self.thresholds.history
        self.losses: deque[float] = deque(maxlen=history)
        self.loss_steps: deque[int] = deque(maxlen=history)  # the step of each value
        self.grad_norms: deque[float] = deque(maxlen=history)
        self._cached: tuple[float, float] | None = None  # (level, noise) of the window as it is
        self._grad_median: float | None = None

    @property
    def ready(self) -> bool:
        """Enough values to judge by (`min_history`)."""
        return len(self.losses) >= self.thresholds.min_history

    # ---- the statistics ----------------------------------------------------------------------------

    def level(self) -> float:
        """The current level: the median of the last few values."""
        return self.level_and_noise()[0]

    def noise(self) -> float:
        """The step-to-step noise of one value (floored)."""
        return self.level_and_noise()[1]

    def level_and_noise(self) -> tuple[float, float]:
        if self._cached is None:
            recent = list(self.losses)
            level = statistics.median(recent[-LEVEL_STEPS:])
            jumps = [abs(b - a) for a, b in zip(recent[:-1], recent[1:], strict=True)]
            spread = ROBUST_SIGMA * statistics.median(jumps) / math.sqrt(2) if jumps else 0.0
            t = self.thresholds
            self._cached = level, max(spread, t.rel_floor * abs(level), t.abs_floor)
        return self._cached

    def z(self, value: float) -> float:
        """How many noise units `value` is above the level (negative below it)."""
        level, noise = self.level_and_noise()
        return (value - level) / noise

    def grad_median(self) -> float:
        if self._grad_median is None:
            self._grad_median = max(statistics.median(self.grad_norms), 1e-12)
        return self._grad_median

    def grad_ratio(self, grad_norm: float | None) -> float | None:
        """`grad_norm` over the recent median (None: not measured, or too few seen)."""
        if grad_norm is None or len(self.grad_norms) < self.thresholds.min_history:
            return None
        return grad_norm / self.grad_median()

    def hardest(self) -> float:
        """The largest value in the window: the run's own hardest recent batch."""
        return max(self.losses)

    # ---- the tests ---------------------------------------------------------------------------------

    def sudden(self, loss: float | None, grad_norm: float | None, after_spike: bool = False) -> str | None:
        """One step far out: its loss against the level, or its gradient norm against the recent median;
        `after_spike`: a smaller rise counts."""
        t = self.thresholds
        if loss is not None and self.ready:
            level = self.level()
            z = self.z(loss)
            rise = t.min_rise_after_spike if after_spike else t.min_rise
            if z > t.max_z and loss > level + rise * abs(level):
                return f"loss {loss:.4g} is {z:.0f} noise units above the recent {level:.4g}"
        ratio = self.grad_ratio(grad_norm)
        if ratio is not None and ratio > t.max_grad_ratio:
            return f"gradient norm {grad_norm:.4g} is {ratio:.0f}x the recent median"
        return None

    def lasting(self, loss: float | None) -> str | None:
        """A shift that lasts (weights damaged by a burst of large updates): the last few steps' median
        against the level before them."""
        if loss is None or not self.ready:
            return None
        before = self._level_before()
        now = statistics.median([*list(self.losses)[-SHIFT_STEPS + 1 :], loss])
        if self._shifted(now, before):
            return (
                f"the loss of the last {SHIFT_STEPS} steps, {now:.4g}, is "
                f"{(now - before) / self.noise():.1f} noise units above the {before:.4g} before them"
            )
        return None

    def elevated(self, loss: float) -> bool:
        """This step's own loss is as far above the level before the recent steps as a lasting shift is
        (if not, a shift `lasting` still sees is coming back)."""
        return self.ready and self._shifted(loss, self._level_before())

    def _level_before(self) -> float:
        recent = list(self.losses)
        return statistics.median(recent[-SHIFT_BASE - SHIFT_STEPS + 1 : -SHIFT_STEPS + 1])

    def _shifted(self, value: float, before: float) -> bool:
        return (value - before) / self.noise() > SHIFT_Z and value > before + SHIFT_RISE * abs(before)

    # ---- the window --------------------------------------------------------------------------------

    def add(self, loss: float | None, grad_norm: float | None = None, step: int = 0) -> None:
        if loss is not None:
            self.losses.append(loss)
            self.loss_steps.append(step)
            self._cached = None
        if grad_norm is not None:
            self.grad_norms.append(grad_norm)
            self._grad_median = None

    def forget_after(self, step: int) -> None:
        """Drop the values of a trajectory restored away (a spike left in would look like a lasting shift)."""
        while self.loss_steps and self.loss_steps[-1] > step:
            self.losses.pop()
            self.loss_steps.pop()
            self._cached = None

    def clear(self, values: bool = True, grad_norms: bool = True) -> None:
        """Forget the values, the gradient norms or both (a new regime: the window is learnt again)."""
        state = self.state_dict()
        if values:
            state["losses"], state["loss_steps"] = [], []
        if grad_norms:
            state["grad_norms"] = []
        self.load_state_dict(state)

    def state_dict(self) -> dict[str, Any]:
        return {
            "losses": list(self.losses),
            "loss_steps": list(self.loss_steps),
            "grad_norms": list(self.grad_norms),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        history = self.thresholds.history
        self.losses = deque((float(v) for v in state["losses"]), maxlen=history)
        steps = state.get("loss_steps", [0] * len(self.losses))  # a checkpoint from before the steps
        self.loss_steps = deque((int(s) for s in steps), maxlen=history)
        self.grad_norms = deque((float(v) for v in state["grad_norms"]), maxlen=history)
        self._cached, self._grad_median = None, None
