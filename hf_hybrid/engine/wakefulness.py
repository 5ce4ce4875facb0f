"""When the engine sleeps, when it wakes, and how often it looks at the real updates meanwhile.

Awake, the update watch holds full-size buffers (the guesses a predict phase applies) and the loss
forecaster runs; asleep, the watch keeps a sample of the coordinates and the forecaster does not run, so
a run whose predictions are far from useful pays little for them. The engine wakes when its confidence
nears the threshold (`WAKE_AT` of it) and sleeps again under half of it: the gap keeps a skill hovering
near one bound from allocating and freeing buffers at every step. While dormant (under half the
threshold), and early in the warmup, it also looks at the real update only every `dormant_every`-th
step: the look it skips is averaged into the next one. Whether a configuration's engine may sleep at
all is `parts.may_sleep`.
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
        the engine switched. Called at WARMUP/FULL steps, when no predict phase is open."""
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
        """Predictions have stayed far from useful: look at the real updates only every n-th step.

        Observing costs several passes over every trainable parameter per step (~15% of a CPU step when
        fully fine-tuning a 22M-parameter model); while the measured confidence sits under half the
        threshold, an averaged update every `dormant_every` steps keeps the predictor and its score alive
        at a fraction of that. (A sleeping engine's observations cost far less still.)
        """
        threshold = self.schedule.confidence_threshold
        if self.config.dormant_every <= 1 or threshold <= 0:
            return False
        if len(self.parts.store) < self.schedule.min_history:
            return False
        return confidence() < threshold / 2

    def skips_look(self, phase: Phase, steps_decided: int, confidence: Confidence) -> bool:
        """Does this real step's update go unobserved (averaged into the next observed one)? Dormant FULL
        steps and early warmup steps are looked at every `dormant_every`-th step only."""
        sparse = (phase is Phase.FULL and self.dormant(confidence)) or (
            phase is Phase.WARMUP and self._early_warmup(steps_decided)
        )
        return sparse and self.parts.watch.unobserved_steps() + 1 < self.config.dormant_every

    def _early_warmup(self, steps_decided: int) -> bool:
        """Warmup only feeds the predictor; its dense history is needed just before the first phase."""
        remaining = self.schedule.warmup_steps - steps_decided
        return remaining > 2 * self.schedule.min_history
