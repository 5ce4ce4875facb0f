"""Who is to blame for a loss spike, the data or the weights, and what the spike guard does about it.

When the detector fires, the step's batch is measured again at a copy of the weights from before the
fault. Bad data is bad there too: the step is skipped (at its first firing step only when *gross*, else
from its second in a row, as a clean run's hard batch comes alone). A batch fine there blames the
weights, and the guard is patient: a shift that comes back within `patience` firing steps is left alone;
one that does not is restored if the copy is still better on the current batch than the weights now.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import torch

from .alarm import Alarm, DivergenceLevel
from .config import SpikeGuardConfig
from .copy_schedule import CopySchedule
from .guard_copies import Restorable
from .spike_detector import SpikeDetector, Thresholds

logger = logging.getLogger(__name__)

SPIKE = "loss spike"  # how a spike alarm's reason starts
DATA, WEIGHTS = "data", "weights"
# The batch is blamed when its loss at the copy is within this share of the rise of the loss now: bad data
# is (about) as bad there; damaged weights are not. A restore needs the copy that much better too.
BLAME_SHARE = 0.5
# Without a way to measure the step's batch again (`suspect_loss`), sudden spikes in a row skipped as
# bad batches before the weights are blamed.
BLAME_AFTER = 5
MAX_SKIPS = 8  # spikes in a row skipped as bad batches; after that the data has changed: the run trains on
# Gross: over (1 + GROSS_RISE)x the level and HARDEST_RISE x the window's hardest batch (data faults:
# 1.37-3.3x the hardest; clean runs at most 1.13x; `benchmarks/README.md`, "The spike guard").
GROSS_RISE = 1.0
HARDEST_RISE = 1.25


def detector_for(config: SpikeGuardConfig) -> SpikeDetector:
    """The engine's spike detector with the guard's thresholds."""
    return SpikeDetector(
        Thresholds(
            history=config.history,
            min_history=config.min_history,
            max_z=config.max_z,
            min_rise=config.min_rise,
            min_rise_after_spike=config.min_rise_after_spike,
            max_grad_ratio=config.max_grad_ratio,
        )
    )


def _spike_alarm(why: str, **kind: bool) -> Alarm:
    return Alarm(DivergenceLevel.CRITICAL, f"{SPIKE}: {why}", spike=True, **kind)


class Blame:
    """The guard's judgement of each step: the culprit, the suspicion of the weights, the patience."""

    def __init__(
        self,
        config: SpikeGuardConfig,
        detector: SpikeDetector,
        copies: CopySchedule,
        params: list[torch.Tensor],
        suspect_loss: Callable[[], float | None] | None,
    ) -> None:
        self.config = config
        self.detector = detector
        self.copies = copies
        self.params = params
        self.suspect_loss = suspect_loss
        self.skips_in_a_row = 0
        self.restored_since_update = False  # the weights are a trusted copy: spikes are the batches'
        self.suspect_since: int | None = None  # the first step a spike blamed the weights, not yet undone
        self.suspect_level = 0.0  # the loss's level then
        self.suspect_hits = 0  # steps that fired since, blamed on the weights
        self.quiet_steps = 0  # steps in a row since the last firing while suspect
        self.blames = {DATA: 0, WEIGHTS: 0}
        self.fired = False  # whether the detector fired at the step judged last
        self.fired_at: int | None = None  # the last step it fired at
        self.loss = math.nan  # the loss of the step judged last

    def judge(self, step: int, loss: float, grad_norm: float | None, can_skip: bool) -> list[Alarm]:
        """A firing is blamed first (`culprit`, once per suspicion): the data's fault skips the step when
        gross or in a row (up to `MAX_SKIPS`); the weights' waits `patience` firing steps, then restores."""
        self.loss = loss
        lasting = self.detector.lasting(loss)
        if lasting and not self.detector.elevated(loss):
            lasting = None  # the recent median is still up, but this step is back: coming back
        after_spike = self.skips_in_a_row > 0 or self.restored_since_update
        sudden = None if lasting else self.detector.sudden(loss, grad_norm, after_spike)
        why = lasting or sudden
        self.fired = why is not None
        in_a_row = self.fired_at == step - 1
        if why is None:
            self._quiet(step)
            return []
        self.fired_at, self.quiet_steps = step, 0
        culprit = WEIGHTS if self.suspect_since is not None else self.culprit(step, loss, sudden is not None)
        self.blames[culprit] += 1
        if culprit == DATA:
            gross = sudden is not None and self.gross(loss)
            if (in_a_row or gross) and can_skip and self.skips_in_a_row < MAX_SKIPS:
                blamed = f"{why}; the batch is to blame"
                return [_spike_alarm(blamed, blames_weights=False, skips_step=True, replaces_batch=True)]
            return []
        self.suspect_hits += 1
        if self.suspect_since is None:
            self.suspect_since, self.suspect_level = step, self.detector.level()
        if self.suspect_hits < self.config.patience:
            logger.info(
                "hf_hybrid: step %d: %s: %s; the weights are to blame: waiting (%d of %d firing steps) for "
                "the loss to come back by itself",
                step,
                SPIKE,
                why,
                self.suspect_hits,
                self.config.patience,
            )
            return []
        return [
            _spike_alarm(f"{why}; the weights are to blame since step {self.suspect_since}", restorable=True)
        ]

    def culprit(self, step: int, loss: float, sudden: bool) -> str:
        """`DATA` or `WEIGHTS`: is this step's batch as bad at a copy from before it? One forward pass.
        Unmeasurable, a sudden spike is the batch's until `BLAME_AFTER` in a row, a lasting shift the
        weights'; right after a restore, the batch is to blame."""
        if self.restored_since_update:
            return DATA
        measured = self._loss_at(self.copies.before(step))
        if measured is None:
            return DATA if sudden and self.skips_in_a_row < BLAME_AFTER else WEIGHTS
        # while the weights are suspect the window has learnt the raised losses: the rise is from before
        level = self.detector.level() if self.suspect_since is None else self.suspect_level
        return WEIGHTS if loss - measured > BLAME_SHARE * (loss - level) else DATA

    def gross(self, loss: float) -> bool:
        """Bad data, not a hard batch: far above the level and the recent window's hardest batch."""
        level = self.detector.level()
        return loss - level > GROSS_RISE * abs(level) and loss > HARDEST_RISE * self.detector.hardest()

    def worth_restoring(self, step: int, copy: Restorable) -> bool:
        """The copy is still better on this step's batch than the weights now, by `BLAME_SHARE` of the rise
        (an unmeasurable copy is); if not, the suspicion ends with nothing undone."""
        measured = self._loss_at(copy)
        if measured is None or self.loss - measured > BLAME_SHARE * (self.loss - self.suspect_level):
            return True
        logger.info(
            "hf_hybrid: step %d: the copy of step %s is no better on this batch (%.4g) than the weights now "
            "(%.4g): restoring it would give up more than the spike costs; nothing undone",
            step,
            copy.step,
            measured,
            self.loss,
        )
        self.clear()
        return False

    def onset(self, step: int) -> int:
        """The step the fault was first seen at: the suspicion's first firing step, or this one."""
        return step if self.suspect_since is None else self.suspect_since

    def _loss_at(self, copy: Restorable) -> float | None:
        """This step's batch's loss with `copy`'s weights swapped in (then swapped back, bit-exact)."""
        if self.suspect_loss is None or copy.available() is not None:
            return None
        if not copy.swap(self.params):
            return None
        try:
            measured = self.suspect_loss()
        finally:
            copy.swap(self.params)
        return measured if measured is not None and math.isfinite(measured) else None

    def applied(self) -> bool:
        """A step was applied: whether it was clean and the weights are not suspect (a copy may be due)."""
        self.restored_since_update = False
        if self.fired:  # a spike applied past `MAX_SKIPS` keeps the count: the data changed
            return False
        self.skips_in_a_row = 0
        return self.suspect_since is None

    def restored(self) -> None:
        self.skips_in_a_row = 0
        self.restored_since_update = True
        self.clear()

    def _quiet(self, step: int) -> None:
        """A step the detector let pass: a suspicion of the weights ends after `patience` quiet steps."""
        if self.suspect_since is None:
            return
        self.quiet_steps += 1
        if self.quiet_steps >= self.config.patience:
            logger.info(
                "hf_hybrid: step %d: the loss came back by itself after the spike of step %d; nothing undone",
                step,
                self.suspect_since,
            )
            self.clear()

    def clear(self) -> None:
        """The suspicion ends."""
        self.suspect_since, self.suspect_hits, self.quiet_steps = None, 0, 0

    def state_dict(self) -> dict[str, Any]:
        return {
            "skips_in_a_row": self.skips_in_a_row,
            "restored_since_update": self.restored_since_update,
            "suspicion": [self.suspect_since, self.suspect_hits, self.quiet_steps, self.suspect_level],
            "fired_at": self.fired_at,
            "blames": dict(self.blames),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.skips_in_a_row = int(state.get("skips_in_a_row", 0))
        self.restored_since_update = bool(state.get("restored_since_update", False))
        since, hits, quiet, level = state.get("suspicion", [None, 0, 0, 0.0])
        self.suspect_since = None if since is None else int(since)
        self.suspect_hits, self.quiet_steps, self.suspect_level = int(hits), int(quiet), float(level)
        fired_at = state.get("fired_at")
        self.fired_at = None if fired_at is None else int(fired_at)
        self.blames = {DATA: 0, WEIGHTS: 0, **{k: int(v) for k, v in state.get("blames", {}).items()}}
