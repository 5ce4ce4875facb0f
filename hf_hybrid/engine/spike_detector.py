"""The engine's one spike detector: is a value far out against a window of recent clean ones?

Both checkers that look for spikes read it: the spike guard (every real step's loss and gradient norm,
`spike_guard.py`) and the divergence monitor (the loss, the gradient norm and the loss forecast's error
of every step it scores, `divergence.py`); each keeps its own windows, as each has its own idea of a clean
step (the guard leaves skipped spikes and restored-away steps out, the monitor its alarmed steps).

The statistics are robust and local: the *level* is the median of the last few values, the *noise* the
robust spread of step-to-step differences over the window. A running mean and variance were the
monitor's first statistics: the steep early descent of a fine-tune inflates a variance for hundreds of
steps and hides a real spike, while the differences of successive values do not see a trend. On top of
them, the guard's two tests: a *sudden* spike (one step far out) and a *lasting* shift (the median of the
last few steps against the level before them).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Any

LEVEL_STEPS = 5  # the guard's level: the median of this many recent clean values
# A lasting shift: the median of the last SHIFT_STEPS losses SHIFT_Z noise units and SHIFT_RISE of the
# level above the median of the SHIFT_BASE steps before them. Two of three steps that far out by chance
# is rare (~5e-6 a step for Gaussian noise); an lr x30 burst on the 2x64 GPT-2 raised the loss by 4
# noise units and 19% for six steps without any single step passing the one-step test.
SHIFT_STEPS, SHIFT_BASE, SHIFT_Z, SHIFT_RISE = 3, 20, 3.0, 0.1
ROBUST_SIGMA = 1.4826  # the median absolute deviation of a Gaussian, in standard deviations


@dataclass(frozen=True)
class Thresholds:
    """What counts as far out. A sudden spike: more than `max_z` noise units and `min_rise` of the level
    above it (`min_rise_after_spike` right after one), or a second value (a gradient norm) over
    `max_grad_ratio` times its recent median. `min_history` values before any judgement; the noise is
    floored at `rel_floor` of the level (a flat loss would give infinite z-scores) and `abs_floor`."""

    history: int = 50
    min_history: int = 20
    max_z: float = 6.0
    min_rise: float = 0.5
    min_rise_after_spike: float = 0.2
    max_grad_ratio: float = 100.0
    rel_floor: float = 1e-3
    abs_floor: float = 1e-12


class SpikeDetector:
    """A window of recent clean values (each with its step) and of a second signal (gradient norms), its
    robust level and noise (computed once per change of the window), and the sudden and lasting tests."""

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
        """One step far out: its loss against the level in noise units and as a share of the level, or
        its gradient norm against the recent median. `after_spike`: the step before was one, so a smaller
        rise counts (`min_rise_after_spike`)."""
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
        recent = list(self.losses)
        before = statistics.median(recent[-SHIFT_BASE - SHIFT_STEPS + 1 : -SHIFT_STEPS + 1])
        now = statistics.median([*recent[-SHIFT_STEPS + 1 :], loss])
        shift = (now - before) / self.noise()
        if shift > SHIFT_Z and now > before + SHIFT_RISE * abs(before):
            return (
                f"the loss of the last {SHIFT_STEPS} steps, {now:.4g}, is {shift:.1f} noise units above "
                f"the {before:.4g} before them"
            )
        return None

    def elevated(self, loss: float) -> bool:
        """This step's own loss is as far above the level before the recent steps as a lasting shift
        is: when it is not, a shift that `lasting` still sees in the recent median is coming back."""
        if not self.ready:
            return False
        recent = list(self.losses)
        before = statistics.median(recent[-SHIFT_BASE - SHIFT_STEPS + 1 : -SHIFT_STEPS + 1])
        return (loss - before) / self.noise() > SHIFT_Z and loss > before + SHIFT_RISE * abs(before)

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
        """The values of the steps after `step` belong to a trajectory that was restored away: a spike
        left in the window would make the next steps look like a lasting shift again."""
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
