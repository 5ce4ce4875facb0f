"""One predict phase: from the step that opens it to the step that closes it, and how it ended.

The engine opens a `PredictPhase` when the controller enters PREDICT (after taking the rollback
snapshot), records every predicted step in it, asks it at the CORRECT step whether the loss regressed,
and closes it once, with a `PhaseEnd`.
"""

from __future__ import annotations

import math
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
