"""When the engine sleeps, when it wakes, and how often it looks at the real updates meanwhile.

Awake, the update watch holds full-size buffers (the guesses a predict phase applies) and the loss
forecaster runs; asleep, the watch keeps a sample of the coordinates and the forecaster does not run, so
a run whose predictions are far from useful pays little for them. The engine wakes when its confidence
nears the threshold (`WAKE_AT` of it) and sleeps again under half of it: the gap keeps a skill hovering
near one bound from allocating and freeing buffers at every step. While dormant (under half the
threshold), and early in the warmup, it also looks at the real update only every `dormant_every`-th
step: the look it skips is averaged into the next one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from .config import EngineConfig
from .loss_watch import LossWatch
from .phases import Phase
from .residuals import ResidualStore
from .timing import PartTimer
from .watch import UpdateWatch

logger = logging.getLogger(__name__)

# The sleeping engine wakes when its confidence reaches this share of the threshold.
WAKE_AT = 0.75

Confidence = Callable[[], float]  # the engine's measured confidence, asked only when needed


class Wakefulness:
    """Puts the update watch and the loss watch to sleep or wakes them, and thins out the looks."""

    def __init__(
        self,
        config: EngineConfig,
        watch: UpdateWatch,
        losses: LossWatch,
        store: ResidualStore,
        timer: PartTimer,
    ) -> None:
        self.config = config
        self.schedule = config.schedule
        self.watch = watch
        self.losses = losses
        self.store = store
        self.timer = timer

    @staticmethod
    def may_sleep(config: EngineConfig) -> bool:
        """`dormant_every=1` asks for an engine that watches every step in full: it never sleeps; nor does
        a scripted one, whose predict phases open whatever the confidence (and need full-size guesses)."""
        s = config.schedule
        return s.confidence_threshold > 0 and config.dormant_every > 1 and s.script is None

    @property
    def awake(self) -> bool:
        return self.watch.awake

    def update(self, confidence: Confidence, step_number: int) -> bool:
        """Sleep while the skill is unknown or far from the threshold, wake when it nears it; True when
        the engine switched. Called at WARMUP/FULL steps, when no predict phase is open."""
        if not self.watch.can_sleep:
            return False
        s = self.schedule
        sleepy = self.dormant(confidence) or (
            not self.awake
            and (len(self.store) < s.min_history or confidence() < WAKE_AT * s.confidence_threshold)
        )
        if sleepy == (not self.awake):
            return False
        with self.timer.part("wake"):
            self.watch.set_awake(not sleepy)
            self.losses.set_awake(not sleepy)
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
        if len(self.store) < self.schedule.min_history:
            return False
        return confidence() < threshold / 2

    def skips_look(self, phase: Phase, steps_decided: int, confidence: Confidence) -> bool:
        """Does this real step's update go unobserved (averaged into the next observed one)? Dormant FULL
        steps and early warmup steps are looked at every `dormant_every`-th step only."""
        sparse = (phase is Phase.FULL and self.dormant(confidence)) or (
            phase is Phase.WARMUP and self._early_warmup(steps_decided)
        )
        return sparse and self.watch.unobserved_steps() + 1 < self.config.dormant_every

    def _early_warmup(self, steps_decided: int) -> bool:
        """Warmup only feeds the predictor; its dense history is needed just before the first phase."""
        remaining = self.schedule.warmup_steps - steps_decided
        return remaining > 2 * self.schedule.min_history
