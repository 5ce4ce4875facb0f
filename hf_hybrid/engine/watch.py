"""What the engine watches of the optimizer's work: the real update of each observed step, and the
predictor's guess of it.

Scoring always runs on a seeded sample of the coordinates (`CoordinateSample`): the skill is a ratio of
sums, so the sample estimates it (within 0.01-0.02 on the benchmark tasks: `docs/history.md`, "sampled
skill") at a cost that does not grow with the model. A `supports_sharding` predictor gets a twin on the
sample, the `scorer`; any other's full-size guess is gathered there. Asleep the watch keeps no full-size
buffer; awake it adds the full-size predictor (and tracker, for `needs_deltas`) and scores on a denser
sample. Each switch starts the predictors and trackers over on the new extent.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch

from .alarm import Alarm, DivergenceLevel
from .predictor import DeltaPredictor, Deltas, build_predictor, predictor_class
from .sample import CoordinateSample
from .sharding import ShardGroup, local
from .updates import RealUpdateTracker

logger = logging.getLogger(__name__)

AWAKE_SAMPLE = 4096  # coordinates scored per tensor while awake, about (all of a smaller tensor)


class UpdateWatch:
    """The real-update trackers and the predictors, on the sample and, awake, on the parameters. With a
    predictor instance (it cannot be rebuilt) or `supports_sampling = False`, the watch never sleeps."""

    def __init__(
        self,
        params: Mapping[str, torch.Tensor],
        predictor_name: str,
        predictor_kwargs: Mapping[str, Any],
        optimizer: torch.optim.Optimizer | None,
        seed: int,
        may_sleep: bool,
        predictor: DeltaPredictor | None = None,
        shards: ShardGroup | None = None,
    ) -> None:
        if predictor is not None and not isinstance(predictor, DeltaPredictor):
            raise TypeError(
                f"`predictor` must be a DeltaPredictor instance, got {type(predictor).__qualname__}"
            )
        self.params = dict(params)
        self.optimizer = optimizer
        self.shards = shards or ShardGroup()
        self.instance = predictor
        self.predictor_name = predictor.name if predictor is not None else predictor_name
        self.predictor_kwargs = dict(predictor_kwargs)
        ranges = {n: self.shards.flat_range(p) for n, p in self.params.items()}
        shapes = {n: p.shape for n, p in self.params.items()}
        self.sparse = CoordinateSample(shapes, seed, ranges=ranges)
        self.dense = CoordinateSample(shapes, seed, ranges=ranges, min_per_tensor=AWAKE_SAMPLE)
        cls = type(predictor) if predictor is not None else predictor_class(predictor_name)
        self.can_sleep = may_sleep and predictor is None and cls.supports_sampling
        self.has_twin = predictor is None and cls.supports_sampling and cls.supports_sharding
        if self.shards.sharded and not cls.supports_sharding:
            raise ValueError(
                f"predictor {self.predictor_name!r} mixes the coordinates of a tensor and cannot run on "
                "sharded parameters (FSDP); use one that sets `supports_sharding`, e.g. 'ema' or 'adam'"
            )
        self.awake = False
        self.sampled_updates: RealUpdateTracker
        self.scorer: DeltaPredictor | None = None
        self.updates: RealUpdateTracker | None = None  # awake, for a predictor that needs the updates
        self._full: DeltaPredictor | None = None
        self.set_awake(not self.can_sleep)

    @property
    def sample(self) -> CoordinateSample:
        """The coordinates scored now: the sparse sample asleep, the dense one awake."""
        return self.dense if self.awake else self.sparse

    @property
    def predictor(self) -> DeltaPredictor:
        """The predictor whose guesses a PREDICT step would apply (asleep: the sampled one)."""
        return self._full if self.awake else self.scorer

    def _build(self, sample: CoordinateSample | None) -> DeltaPredictor:
        return build_predictor(
            self.predictor_name,
            params=self.params,
            optimizer=self.optimizer,
            sample=sample,
            **self.predictor_kwargs,
        )

    def set_awake(self, awake: bool) -> None:
        """Build the predictors and trackers for the new state, from the parameters as they are now."""
        self.awake = awake
        self.sampled_updates = RealUpdateTracker(self.params, self.sample)
        if not awake:
            self.updates, self._full = None, None
            self.scorer = self._build(self.sparse)
            return
        self._full = self.instance or self._build(None)
        self.scorer = self._build(self.dense) if self.has_twin else None
        self.updates = RealUpdateTracker(self.params) if self._full.needs_deltas else None

    def _shapes(self, sampled: bool) -> dict[str, tuple[int, ...]]:
        """What a guess must look like: the parameters' (local) shapes, or the sampled coordinates' counts."""
        if sampled:
            return {name: (self.sample.count(name),) for name in self.params}
        return {name: tuple(local(p).shape) for name, p in self.params.items()}

    def guess(self, steps_ahead: int) -> tuple[Deltas | None, Alarm | None]:
        """The full-size guess a PREDICT step applies, or (None, a CRITICAL alarm): see `_ask`."""
        return self._ask(self.predictor, steps_ahead, sampled=not self.awake, scoring=False)

    def sampled_guess(self, steps_ahead: int) -> tuple[Deltas | None, Alarm | None]:
        """The guess at the sampled coordinates, for scoring (its alarm blames no weights)."""
        if self.scorer is not None:
            return self._ask(self.scorer, steps_ahead, sampled=True, scoring=True)
        predicted, alarm = self._ask(self._full, steps_ahead, sampled=False, scoring=True)
        if predicted is not None:
            predicted = {name: self.sample.gather(name, t) for name, t in predicted.items()}
        return predicted, alarm

    def _ask(
        self, predictor: DeltaPredictor, steps_ahead: int, sampled: bool, scoring: bool
    ) -> tuple[Deltas | None, Alarm | None]:
        """(guess, None), or (None, an alarm) for a predictor that raised or guessed a wrong shape (then
        reset); CRITICAL unless only `scoring`. Sharded, a failure on any rank is a failure on all."""
        failure = None
        try:
            predicted = predictor.predict(steps_ahead)
            _check_guess(predicted, self._shapes(sampled))
        except Exception as exc:  # noqa: BLE001 - any predictor failure must end in a safe fallback
            logger.warning("hf_hybrid: predictor %r failed (%r); reset it", self.predictor_name, exc)
            predicted, failure = None, f"the predictor failed ({type(exc).__name__})"
        if self.shards.any(failure is not None) and failure is None:
            predicted, failure = None, "the predictor failed on another rank"
        if failure is None:
            return predicted, None
        self.reset()
        if scoring:
            return None, Alarm(DivergenceLevel.WARNING, failure, blames_weights=False)
        return None, Alarm(DivergenceLevel.CRITICAL, failure)

    def reset(self) -> None:
        """Forget what the predictors learnt (their output was refused, or they raised)."""
        for predictor in self._predictors():
            predictor.reset()

    def _predictors(self) -> list[DeltaPredictor]:
        """The scorer and the full-size predictor, each once (asleep: the scorer alone)."""
        return [p for p in (self.scorer, self._full) if p is not None]

    # ---- the real updates --------------------------------------------------------------------------

    def unobserved_steps(self) -> int:
        """Real steps since the last `take()` that nobody looked at."""
        return self.sampled_updates.unobserved_steps

    def skip(self) -> None:
        """A real step nobody looked at: the next `take()` averages over it."""
        for tracker in self._trackers():
            tracker.skip()

    def take(self) -> tuple[Deltas, Deltas | None]:
        """The real update per step since the last look: at the sample, and whole where it is needed."""
        return self.sampled_updates.take(), None if self.updates is None else self.updates.take()

    def observe(self, sampled: Deltas, whole: Deltas | None) -> None:
        """The predictors learn from one real update (one that does not read them gets none)."""
        if self.scorer is not None:
            self.scorer.observe(sampled)
        if self.awake:
            self._full.observe(whole if whole is not None else {})

    def shift(self, applied: Mapping[str, torch.Tensor]) -> None:
        """A predicted update was written: it is not part of the next real update."""
        for tracker in self._trackers():
            tracker.shift(applied)

    def reset_to(self, snapshot: Mapping[str, torch.Tensor]) -> None:
        """The parameters were rolled back to `snapshot`."""
        for tracker in self._trackers():
            tracker.reset_to(snapshot)

    def _trackers(self) -> list[RealUpdateTracker]:
        return [self.sampled_updates] + ([] if self.updates is None else [self.updates])

    # ---- memory and checkpoints --------------------------------------------------------------------

    def predictor_bytes(self) -> int:
        """The acting predictor's buffers; awake, the scorer beside it counts in the engine's bytes only."""
        return self.predictor.nbytes()

    def tensors(self) -> list[torch.Tensor]:
        return [
            *(t for tracker in self._trackers() for t in tracker.last.values()),
            *(t for p in self._predictors() for t in p.tensors().values()),
        ]

    def state_dict(self) -> dict[str, Any]:
        """`updates`/`predictor`: the acting tracker and predictor; awake, the sampled ones beside them."""
        if not self.awake:
            return {
                "awake": False,
                "updates": self.sampled_updates.state_dict(),
                "predictor": self.scorer.state_dict(),
            }
        return {
            "awake": True,
            "updates": None if self.updates is None else self.updates.state_dict(),
            "predictor": self._full.state_dict(),
            "sampled_updates": self.sampled_updates.state_dict(),
            "scorer": None if self.scorer is None else self.scorer.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Its wakefulness first, then its contents (a state without `sampled_updates` starts them over)."""
        self.set_awake(bool(state["awake"]))
        if not self.awake:
            self.sampled_updates.load_state_dict(state["updates"])
            self.scorer.load_state_dict(state["predictor"])
            return
        if self.updates is not None:
            self.updates.load_state_dict(state["updates"])
        self._full.load_state_dict(state["predictor"])
        if "sampled_updates" in state:
            self.sampled_updates.load_state_dict(state["sampled_updates"])
            if self.scorer is not None:
                self.scorer.load_state_dict(state["scorer"])


def _check_guess(predicted: Mapping[str, torch.Tensor] | None, shapes: Mapping[str, tuple[int, ...]]) -> None:
    """Raise if a guess names an unknown parameter or has another shape than it should."""
    for name, delta in (predicted or {}).items():
        if name not in shapes:
            raise ValueError(f"predicted update for unknown parameter {name!r}")
        if tuple(delta.shape) != shapes[name]:
            raise ValueError(
                f"predicted update for {name!r} has shape {tuple(delta.shape)}, expected {shapes[name]}"
            )
