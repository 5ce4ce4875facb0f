"""The predictor's side of a step: what it learns from a real step, and how its guess is written in a
predicted one.

A real step's update is taken after the optimizer runs; past the warmup the guess of it (asked before)
is scored on the sampled coordinates, then the predictor learns. A predicted step writes the full-size
guess through the guard (clipped to the trust region, or refused whole).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

from .alarm import Alarm
from .parts import EngineParts
from .phases import Phase
from .predictor import Deltas, delta_dot_products
from .residuals import Residual

logger = logging.getLogger(__name__)


class Learner:
    """Runs the real update and the scoring around the optimizer step, and the guarded predicted write."""

    def __init__(self, parts: EngineParts) -> None:
        self.parts = parts

    def real_update(
        self, optimizer_step: Callable[[], None], look: bool = True
    ) -> tuple[Deltas, Deltas | None] | None:
        """Run the optimizer step and take the real update per step since the last look (`look=False`:
        left to the next look, which averages)."""
        optimizer_step()
        self.parts.guard.forget_compensation()  # the parameters were rewritten: no rounding error to carry
        if not look:
            self.parts.watch.skip()
            return None
        with self.parts.timer.part("real_update"):
            return self.parts.watch.take()

    def learn(
        self,
        optimizer_step: Callable[[], None],
        look: bool,
        phase: Phase,
        step: int,
        steps_ahead: int,
        losses: tuple[float | None, float | None],
    ) -> tuple[Residual | None, Alarm | None]:
        """The optimizer step and what the predictor learns from it: past the warmup, the residual of its
        scored guess (else None) and the alarm of a guess that failed."""
        if not look:
            self.real_update(optimizer_step, look=False)
            return None, None
        scored = phase is not Phase.WARMUP  # warmup only observes: no prediction to score, no cost
        predicted, alarm = self.guess(steps_ahead, sampled=True) if scored else (None, None)
        sampled, whole = self.real_update(optimizer_step)
        residual = None
        if scored:
            residual = Residual(step, phase.value, steps_ahead, *self._score(predicted, sampled), *losses)
            with self.parts.timer.part("residuals"):
                self.parts.store.add(residual)
                self.parts.corrector.update(residual)
        with self.parts.timer.part("observe"):
            self.parts.watch.observe(sampled, whole)
        return residual, alarm

    def _score(self, predicted: Deltas | None, sampled: Deltas) -> tuple[float, float, float]:
        """The dot products over the whole sample; a non-finite guess scores as none (predictors reset)."""
        with self.parts.timer.part("score"):
            pd, pp, dd = self.parts.shards.sum(delta_dot_products(predicted, sampled))
        if math.isfinite(pd) and math.isfinite(pp):
            return pd, pp, dd
        logger.warning(
            "hf_hybrid: predictor %r produced a non-finite guess; reset it", self.parts.watch.predictor_name
        )
        self.parts.counters.add("refused_updates")
        self.parts.watch.reset()
        return 0.0, 0.0, dd

    def write_guess(self, steps_ahead: int, max_delta: float) -> tuple[bool, Alarm | None]:
        """Write the full-size guess, scaled by the corrector, through the guard: (written?, alarm)."""
        predicted, alarm = self.guess(steps_ahead)
        if predicted is not None:
            with self.parts.timer.part("guard"):
                alarm, deltas = self.parts.guard.apply(predicted, max_delta, self.parts.corrector.scale)
            if alarm is None:
                with self.parts.timer.part("real_update"):
                    self.parts.watch.shift(deltas)  # a written guess is no part of the next real update
            else:
                self.parts.watch.reset()
        if alarm is not None:
            self.parts.counters.add("refused_updates")
        return predicted is not None and alarm is None, alarm

    def guess(self, steps_ahead: int, sampled: bool = False) -> tuple[Deltas | None, Alarm | None]:
        """The full-size guess a predict step applies, or (`sampled`) the one at the sample, to score."""
        with self.parts.timer.part("guess"):
            ask = self.parts.watch.sampled_guess if sampled else self.parts.watch.guess
            predicted, alarm = ask(steps_ahead)
        if alarm is not None:
            self.parts.counters.add("predictor_errors")
        return predicted, alarm
