"""One predict phase: from the step that opens it to the step that closes it, and how it ended.

The engine opens a `PredictPhase` when the controller enters PREDICT (after taking the rollback
snapshot), records every predicted step in it, asks it at the CORRECT step whether the loss regressed,
and closes it once, with a `PhaseEnd`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any


class PhaseEnd(str, Enum):
    """How a predict phase ended."""

    COMPLETED = "completed"  # its CORRECT step validated it
    ROLLED_BACK = "rolled_back"  # its updates were undone (snapshot restored)
    ABANDONED = "abandoned"  # ended as failed, weights kept (rollback disabled, or nothing to blame)


@dataclass
class PredictPhase:
    """The open phase's bookkeeping.

    `reference_loss`/`reference_noise`: the loss level it must not regress from and the batch-to-batch
    noise of real-step losses, fixed when it opens. `probe_before`: the probe's loss at the last validated
    point (None without a probe). `losses`: the losses measured in its checked predict steps.
    """

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

    def verdict(self, loss: float | None, probe_after: float | None, sigma: float) -> str | None:
        """Why the predicted updates since the last validated point failed, or None if they held.

        With a probe reading (`probe_after`, taken at this CORRECT step) the probe's loss must have fallen
        since `probe_before`, which then moves here (the next stretch of this phase starts from it);
        without one, the training loss must not have regressed (`regressed`)."""
        if probe_after is not None and self.probe_before is not None:
            if not probe_after < self.probe_before:
                return f"probe loss did not fall ({self.probe_before:.4f} -> {probe_after:.4f})"
            self.probe_before = probe_after
            return None
        return "loss regressed over the predict phase" if self.regressed(loss, sigma) else None

    def regressed(self, loss: float | None, sigma: float) -> bool:
        """Did the loss over the phase (its checked steps + this CORRECT step's) rise past tolerance?

        The mean of the `n` measured losses may exceed the reference by `sigma` standard errors of the
        noise (`reference_noise / sqrt(n)`); a missing or non-finite loss counts as regressed.
        """
        if loss is None or not math.isfinite(loss):
            return True
        if not (math.isfinite(self.reference_loss) and math.isfinite(self.reference_noise)):
            return False
        measured = [x for x in self.losses if math.isfinite(x)] + [loss]
        mean = sum(measured) / len(measured)
        return mean > self.reference_loss + sigma * self.reference_noise / math.sqrt(len(measured))

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> PredictPhase:
        return cls(**{**state, "losses": [float(x) for x in state["losses"]]})


# Lower bound of the loss noise a predict phase is judged against, relative to the loss.
REL_NOISE_FLOOR = 1e-3


def reference_level(
    forecast: Callable[[], float] | None, full_losses: list[float | None]
) -> tuple[float, float] | None:
    """Loss level a predict phase must not regress from (the loss forecaster's one-step `forecast()`) and
    the batch-to-batch noise of recent FULL-step losses (robust: median absolute change); None when there
    is no forecast or fewer than 5 losses (the caller falls back to the monitor's running statistics).

    Not the monitor's running statistics first: on a falling loss their mean lags and their spread is
    mostly trend, and the forecaster's error grows with every spike it sees; with either, phases that
    raised the loss by 1.5 passed (tests/faults, a confidently wrong predictor).
    """
    full = [x for x in full_losses if x is not None and math.isfinite(x)]
    if forecast is None or len(full) < 5:
        return None
    mean = forecast()
    changes = sorted(abs(b - a) for a, b in zip(full, full[1:], strict=False))
    # median |x_t - x_{t-1}| of Gaussian noise = 0.954 sigma
    std = max(changes[len(changes) // 2] / 0.954, REL_NOISE_FLOOR * abs(mean))
    if math.isfinite(mean) and math.isfinite(std) and std > 0:
        return mean, std
    return None
