"""The losses the engine has seen, and the loss forecaster trained on them while the engine is awake.

The forecaster matters only near predict phases, so a sleeping engine does not run it: it keeps the last
`MEMORY` losses, and a forecaster built on waking is trained on them first.
"""

from __future__ import annotations

import math
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
        self.predicted: float | None = None
        self.measured: float | None = None

    def _build(self) -> LossForecaster:
        # 6.4% of the tiny GPT-2's step awake (issue 23); every 8th step halves that, but on MiniLM the
        # GRU was then trusted on 17% of the steps instead of 35%: left at every 4th.
        forecaster = LossForecaster(seed=self.seed, train_every=4)
        for loss, lr, grad_norm, phase_index in self.recent:
            forecaster.observe(loss, lr, grad_norm, phase_index)
        return forecaster

    def set_awake(self, awake: bool) -> None:
        """A new forecaster (or none): the current step's forecast was the old one's."""
        self.forecaster = self._build() if awake else None
        self.predicted = None

    def forecast(self) -> float | None:
        """The forecaster's guess of the coming step's loss, kept as `predicted` (or None)."""
        guess = None if self.forecaster is None else self.forecaster.next_loss()
        self.predicted = guess if guess is not None and math.isfinite(guess) else None
        return self.predicted

    def forecast_error(self, loss: float | None) -> float | None:
        """Signed (actual - forecast): the monitor scores it one-sided, so a better loss never alarms."""
        if loss is None or self.predicted is None or not math.isfinite(loss):
            return None
        return loss - self.predicted

    def measure(self, loss: float, lr: float, grad_norm: float | None, phase_index: int) -> None:
        """A step measured `loss`; a finite one is observed (and the forecaster learns from it)."""
        self.measured = loss
        if math.isfinite(loss):
            self.observe(loss, lr, grad_norm, phase_index)

    def observe(self, loss: float, lr: float, grad_norm: float | None, phase_index: int) -> None:
        self.recent.append((loss, lr, grad_norm, phase_index))
        if self.forecaster is not None:
            self.forecaster.observe(loss, lr, grad_norm, phase_index)

    def forecast_next(self) -> float | None:
        """The one-step forecast from a roll-out (None: none): the level a new predict phase must keep."""
        if self.forecaster is None or not self.forecaster.num_observed:
            return None
        return self.forecaster.forecast(1).mean[0]

    @property
    def trusted(self) -> bool:
        return self.forecaster is not None and self.forecaster.trusted

    def metrics(self) -> dict[str, float]:
        """The forecast and the measured loss, and awake, how well the forecaster does."""
        losses = {"predicted_loss": self.predicted, "measured_loss": self.measured}
        out = {key: value for key, value in losses.items() if value is not None}
        if self.forecaster is None:
            return out
        errors = self.forecaster.errors()
        return {
            **out,
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

    def restore_last(self, predicted: float | None, measured: float | None) -> None:
        """The last forecast and measured loss of a saved engine (saved beside `state_dict`'s)."""
        self.predicted, self.measured = predicted, measured

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.recent.clear()
        self.recent.extend(tuple(row) for row in state["recent"])
        self.forecaster = None
        if state["forecaster"] is not None:
            self.forecaster = self._build()
            self.forecaster.load_state_dict(state["forecaster"])
