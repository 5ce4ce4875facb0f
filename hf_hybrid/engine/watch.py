"""What the engine watches of the optimizer's work: the real update of each observed step, and the
predictor's guess of it.

Awake, both cover the whole trainable parameters. Asleep — while the guesses are far from useful — they
cover only a seeded sample of the coordinates (`CoordinateSample`): the skill of a guess is a ratio of
sums over coordinates, so the sample estimates it, and the engine keeps no full-size buffer. Switching
rebuilds the tracker and the predictor for the new extent (a predictor starts over: its history was of
the other extent). With sharded parameters both cover this rank's shard (or its part of the sample).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch

from .predictor import DeltaPredictor, Deltas, build_predictor, predictor_class
from .sample import CoordinateSample
from .sharding import ShardGroup, local
from .updates import RealUpdateTracker

logger = logging.getLogger(__name__)


class UpdateWatch:
    """The real-update tracker and the predictor, on the parameters or on their sample.

    A predictor passed as an instance cannot be rebuilt for the sample, and one whose class sets
    `supports_sampling = False` needs the full shapes: with either, the watch never sleeps.
    """

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
        self.params = dict(params)
        self.optimizer = optimizer
        self.shards = shards or ShardGroup()
        self.predictor_name = predictor.name if predictor is not None else predictor_name
        self.predictor_kwargs = dict(predictor_kwargs)
        ranges = {n: self.shards.flat_range(p) for n, p in self.params.items()}
        self.sample = CoordinateSample({n: p.shape for n, p in self.params.items()}, seed, ranges=ranges)
        self.can_sleep = may_sleep and predictor is None and predictor_class(predictor_name).supports_sampling
        self.awake = not self.can_sleep
        self.predictor = predictor or self._build_predictor()
        if self.shards.sharded and not type(self.predictor).supports_sharding:
            raise ValueError(
                f"predictor {self.predictor_name!r} mixes the coordinates of a tensor and cannot run on "
                "sharded parameters (FSDP); use one that sets `supports_sharding`, e.g. 'ema' or 'adam'"
            )
        self.updates = RealUpdateTracker(self.params, None if self.awake else self.sample)

    def _build_predictor(self) -> DeltaPredictor:
        return build_predictor(
            self.predictor_name,
            params=self.params,
            optimizer=self.optimizer,
            sample=None if self.awake else self.sample,
            **self.predictor_kwargs,
        )

    def set_awake(self, awake: bool) -> None:
        """Rebuild the tracker (from the parameters as they are now) and the predictor for the new extent."""
        self.awake = awake
        self.updates = RealUpdateTracker(self.params, None if awake else self.sample)
        self.predictor = self._build_predictor()

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """What a guess must look like: the parameters' (local) shapes, or the sampled coordinates' counts."""
        if self.awake:
            return {name: tuple(local(p).shape) for name, p in self.params.items()}
        return {name: (self.sample.count(name),) for name in self.params}

    def guess(self, steps_ahead: int) -> tuple[Deltas | None, str | None]:
        """(guess, None), or (None, why) for a predictor that raised or returned a tensor of another
        shape than it should (which would crash or silently broadcast); such a predictor is reset.
        Sharded, a failure on any rank is a failure on all (one all-reduce), so all take the same path."""
        failure = None
        try:
            predicted = self.predictor.predict(steps_ahead)
            _check_guess(predicted, self.shapes())
        except Exception as exc:  # noqa: BLE001 - any predictor failure must end in a safe fallback
            logger.warning("hf_hybrid: predictor %r failed (%r); reset it", self.predictor_name, exc)
            predicted, failure = None, f"the predictor failed ({type(exc).__name__})"
        if self.shards.any(failure is not None) and failure is None:
            predicted, failure = None, "the predictor failed on another rank"
        if failure is not None:
            self.predictor.reset()
        return predicted, failure

    def tensors(self) -> list[torch.Tensor]:
        return [*self.updates.last.values(), *self.predictor.tensors().values()]

    def state_dict(self) -> dict[str, Any]:
        return {
            "awake": self.awake,
            "updates": self.updates.state_dict(),
            "predictor": self.predictor.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if bool(state["awake"]) != self.awake:  # the saved extent first, then its contents
            self.set_awake(bool(state["awake"]))
        self.updates.load_state_dict(state["updates"])
        self.predictor.load_state_dict(state["predictor"])


def _check_guess(predicted: Mapping[str, torch.Tensor] | None, shapes: Mapping[str, tuple[int, ...]]) -> None:
    """Raise if a guess names an unknown parameter or has another shape than it should."""
    for name, delta in (predicted or {}).items():
        if name not in shapes:
            raise ValueError(f"predicted update for unknown parameter {name!r}")
        if tuple(delta.shape) != shapes[name]:
            raise ValueError(
                f"predicted update for {name!r} has shape {tuple(delta.shape)}, expected {shapes[name]}"
            )
