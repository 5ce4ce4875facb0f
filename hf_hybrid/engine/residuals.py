"""Residuals (what really happened minus what was predicted) and the corrector fed by them.

The *skill* of a guess p against the real update d, 1 - ||s*p - d||^2 / ||d||^2 (s: the corrector's
scale), decides everything downstream: 1 is perfect, 0 as good as applying nothing. Confidence is the
mean recent skill: measured, never assumed.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

from .validation import check_float, check_int


@dataclass(frozen=True, slots=True)
class Residual:
    """One scored prediction."""

    step: int
    phase: str
    steps_ahead: int
    pd: float  # <predicted, real>
    pp: float  # <predicted, predicted>
    dd: float  # <real, real>
    loss_actual: float | None = None
    loss_predicted: float | None = None

    def skill(self, scale: float) -> float:
        if self.dd <= 0:
            return 0.0
        return 1.0 - (scale * scale * self.pp - 2.0 * scale * self.pd + self.dd) / self.dd

    @property
    def cosine(self) -> float:
        denom = math.sqrt(self.pp * self.dd)
        return self.pd / denom if denom > 0 else 0.0

    @property
    def norm_ratio(self) -> float:
        return math.sqrt(self.pp / self.dd) if self.dd > 0 else 0.0

    @property
    def loss_error(self) -> float | None:
        if self.loss_actual is None or self.loss_predicted is None:
            return None
        return self.loss_actual - self.loss_predicted


class ResidualStore:
    """Bounded store of recent residuals, so confidence tracks the current regime (64: the engine reads
    at most the last 32)."""

    def __init__(self, capacity: int = 64) -> None:
        if capacity < 1:
            raise ValueError(f"`capacity` must be >= 1, got {capacity}")
        self.capacity = capacity
        self._items: deque[Residual] = deque(maxlen=capacity)
        self.total = 0

    def add(self, residual: Residual) -> None:
        self._items.append(residual)
        self.total += 1

    def __len__(self) -> int:
        return len(self._items)

    def recent(self, n: int | None = None, phase: str | None = None) -> list[Residual]:
        items = [r for r in self._items if phase is None or r.phase == phase]
        if n is None:
            return items
        return items[-n:] if n > 0 else []

    def summary(self, scale: float, recent: int) -> dict[str, float]:
        """Mean cosine, norm ratio, skill and residual norms of the last `recent` guesses at `scale`."""
        items = self.recent(recent)
        if not items:
            return {}
        out = {
            "update_cosine": sum(r.cosine for r in items) / len(items),
            "update_norm_ratio": sum(r.norm_ratio for r in items) / len(items),
            "update_skill": sum(r.skill(scale) for r in items) / len(items),
        }
        norms = [math.sqrt(max(scale * scale * r.pp - 2.0 * scale * r.pd + r.dd, 0.0)) for r in items]
        out["residual_norm"] = sum(norms) / len(norms)
        relative = [math.sqrt(max(1.0 - r.skill(scale), 0.0)) for r in items if r.dd > 0]
        if relative:
            out["residual_rel_norm"] = sum(relative) / len(relative)
        return out

    def loss_calibration(self, tolerance: float, recent: int = 32) -> float:
        """Share of the recent CORRECT-step losses forecast within `tolerance` (1 with none yet)."""
        scored = [r for r in self.recent(recent) if r.loss_error is not None and r.phase == "correct"]
        if not scored:
            return 1.0
        return sum(abs(r.loss_error) <= tolerance for r in scored) / len(scored)

    def state_dict(self) -> dict[str, Any]:
        return {"capacity": self.capacity, "total": self.total, "items": [asdict(r) for r in self._items]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._items = deque((Residual(**r) for r in state["items"]), maxlen=self.capacity)
        self.total = int(state["total"])


class Corrector:
    """Online rescaling of the predictor: `scale` tracks the least-squares <p,d>/<p,p> (clamped to
    [0, max_scale]), damping an overshooting predictor, turning off a wrong-way one; a rollback halves it."""

    def __init__(self, rate: float = 0.2, max_scale: float = 1.0, window: int = 16) -> None:
        check_float("rate", rate, 0.0, 1.0, low_open=True)
        check_float("max_scale", max_scale, 0.0, math.inf, low_open=True, high_open=True)
        check_int("window", window, 1)
        self.rate = rate
        self.max_scale = max_scale
        self.window = window
        self.scale = max_scale
        self.rollbacks = 0

    def update(self, residual: Residual) -> None:
        if residual.pp <= 0 or not math.isfinite(residual.pd / residual.pp):
            return
        best = min(max(residual.pd / residual.pp, 0.0), self.max_scale)
        self.scale += self.rate * (best - self.scale)

    def penalize(self) -> None:
        """A predict phase had to be rolled back."""
        self.scale *= 0.5
        self.rollbacks += 1

    def confidence(self, store: ResidualStore) -> float:
        """Mean skill of the recent predictions at the current scale, clamped to [0, 1]."""
        recent = store.recent(self.window)
        if not recent:
            return 0.0
        mean_skill = sum(r.skill(self.scale) for r in recent) / len(recent)
        return min(max(mean_skill, 0.0), 1.0)

    def state_dict(self) -> dict[str, Any]:
        return {"scale": self.scale, "rollbacks": self.rollbacks}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scale = float(state["scale"])
        self.rollbacks = int(state["rollbacks"])
