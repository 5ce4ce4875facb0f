"""When the engine sleeps, when it wakes, and how often it looks at the real updates meanwhile.

Asleep, the watch keeps a sample of the coordinates and the forecaster does not run, so useless
predictions cost little. It wakes at `WAKE_AT` of the threshold and sleeps under half (the gap stops a
hovering skill from allocating and freeing buffers every step). Dormant (under half) and early in the
warmup, it looks at the real update only every `dormant_every`-th step (averaged into the next look).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from .parts import EngineParts
from .phases import Phase

logger = logging.getLogger(__name__)

# The sleeping engine wakes when its confidence reaches this share of the threshold.
WAKE_AT = 0.75

Confidence = Callable[[], float]  # the engine's measured confidence, asked only when needed


class Wakefulness:
    """Puts the update watch and the loss watch to sleep or wakes them, and thins out the looks."""

    def __init__(self, parts: EngineParts) -> None:
        self.parts = parts
        self.config = parts.config
        self.schedule = parts.config.schedule

    @property
    def awake(self) -> bool:
        return self.parts.awake

    def update(self, confidence: Confidence, step_number: int) -> bool:
        """Sleep while the skill is unknown or far from the threshold, wake when it nears it; True when
        the engine switched (called at WARMUP/FULL steps)."""
        if not self.parts.watch.can_sleep:
            return False
        s = self.schedule
        sleepy = self.dormant(confidence) or (
            not self.awake
            and (len(self.parts.store) < s.min_history or confidence() < WAKE_AT * s.confidence_threshold)
        )
        if sleepy == (not self.awake):
            return False
        with self.parts.timer.part("wake"):
            self.parts.watch.set_awake(not sleepy)
            self.parts.losses.set_awake(not sleepy)
        logger.info(
            "hf_hybrid: step %d: confidence %.3f (threshold %.3f): the engine %s",
            step_number,
            confidence(),
            s.confidence_threshold,
            "sleeps (sampled coordinates only)" if sleepy else "wakes (full-size buffers)",
        )
        return True

    def dormant(self, confidence: Confidence) -> bool:
        """Predictions have stayed far from useful: look at the real updates only every n-th step
        (observing costs ~15% of a CPU step of a 22M-parameter full fine-tune)."""
        threshold = self.schedule.confidence_threshold
        if self.config.dormant_every <= 1 or threshold <= 0:
            return False
        if len(self.parts.store) < self.schedule.min_history:
            return False
        return confidence() < threshold / 2

    def skips_look(self, phase: Phase, steps_decided: int, confidence: Confidence) -> bool:
        """Does this real step's update go unobserved (averaged into the next observed one)?"""
        sparse = (phase is Phase.FULL and self.dormant(confidence)) or (
            phase is Phase.WARMUP and self._early_warmup(steps_decided)
        )
        return sparse and self.parts.watch.unobserved_steps() + 1 < self.config.dormant_every

    def _early_warmup(self, steps_decided: int) -> bool:
        """Warmup only feeds the predictor; its dense history is needed just before the first phase."""
        remaining = self.schedule.warmup_steps - steps_decided
        return remaining > 2 * self.schedule.min_history
