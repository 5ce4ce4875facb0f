"""The losses the engine has seen, and the loss forecaster trained on them while the engine is awake.

The forecaster matters only near predict phases (the reference a phase must not regress from, the
forecast-error alarm, the calibration cap on confidence), so a sleeping engine does not run it: it keeps
the last `MEMORY` losses, and a forecaster built on waking is trained on them first.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

import torch

from .loss_forecaster import LossForecaster

MEMORY = 33  # the forecaster's window, plus one


class LossWatch:
    def __init__(self, seed: int, awake: bool) -> None:
        self.seed = seed
        self.recent: deque[tuple[float, float, float | None, int]] = deque(maxlen=MEMORY)
        self.forecaster = self._build() if awake else None

    def _build(self) -> LossForecaster:
        forecaster = LossForecaster(seed=self.seed, train_every=4)  # ~1 ms a step on average
        for loss, lr, grad_norm, phase_index in self.recent:
            forecaster.observe(loss, lr, grad_norm, phase_index)
        return forecaster

    def set_awake(self, awake: bool) -> None:
        self.forecaster = self._build() if awake else None

    def observe(self, loss: float, lr: float, grad_norm: float | None, phase_index: int) -> None:
        self.recent.append((loss, lr, grad_norm, phase_index))
        if self.forecaster is not None:
            self.forecaster.observe(loss, lr, grad_norm, phase_index)

    def next_loss(self) -> float | None:
        """The forecaster's one-step forecast (None asleep, or before it has seen a loss)."""
        return None if self.forecaster is None else self.forecaster.next_loss()

    @property
    def trusted(self) -> bool:
        return self.forecaster is not None and self.forecaster.trusted

    def metrics(self) -> dict[str, float]:
        if self.forecaster is None:
            return {}
        errors = self.forecaster.errors()
        return {
            "loss_forecast_trusted": float(self.forecaster.trusted),
            "loss_forecast_mae": errors["gru_mae"],
            "loss_forecast_baseline_mae": min(errors["last_value_mae"], errors["ema_mae"]),
        }

    def tensors(self) -> list[torch.Tensor]:
        return [] if self.forecaster is None else self.forecaster.tensors()

    def state_dict(self) -> dict[str, Any]:
        return {
            "recent": [list(row) for row in self.recent],
            "forecaster": None if self.forecaster is None else self.forecaster.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.recent.clear()
        self.recent.extend(tuple(row) for row in state["recent"])
        self.forecaster = None
        if state["forecaster"] is not None:
            self.forecaster = self._build()
            self.forecaster.load_state_dict(state["forecaster"])
