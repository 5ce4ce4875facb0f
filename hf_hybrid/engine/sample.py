"""A fixed, seeded sample of each trainable tensor's coordinates: what the engine scores its guesses on.

The engine does not need the whole real update to know how good a guess of it was: the skill
`1 - ||s*p - d||^2 / ||d||^2` of a guess is a ratio of sums over coordinates, and a uniform sample of
the coordinates estimates it. So the sleeping engine keeps its buffers for the sampled coordinates only
(no full-size copy of the parameters, no full-size predictor state), and the awake one scores on a
denser sample (`min_per_tensor`: small tensors, whose stride-401 sample is a coordinate or two, are
sampled at a shorter stride or whole), at a cost that does not grow with the model either.

The sample is systematic: every `stride`-th element of the flattened tensor from a seeded offset, with
a prime stride (so rows of a matrix are not sampled in lockstep) and at most `max_per_tensor` elements.
It is a strided view, not an index tensor, so it costs no memory of its own; it depends only on the
seed, the name and the shape, so every rank samples the same coordinates and a resumed run recomputes
it exactly.

Sharded parameters (see `sharding.py`): the sample is defined on the whole tensor's flattened
coordinates, and each rank gathers the sampled coordinates that fall in its shard (`ranges`: the
shard's [start, stop) in the flattened whole tensor). A `Shard(0)` shard is a contiguous range, so this
is still a strided view of the local tensor, and the union of the ranks' samples is exactly the sample
one process takes: the sums of the skill, all-reduced, are the single process's sums (up to the order
of float additions), so a sharded run sleeps, wakes and scores like an unsharded one.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping

import torch

DEFAULT_STRIDE = 401  # a prime: ~0.25% of the coordinates of a large tensor
DEFAULT_MAX_PER_TENSOR = 65536


def _next_prime(n: int) -> int:
    def prime(k: int) -> bool:
        return k >= 2 and all(k % d for d in range(2, math.isqrt(k) + 1))

    while not prime(n):
        n += 1
    return n


class CoordinateSample:
    """`gather(name, tensor)` -> the sampled coordinates of `tensor`, flattened (a view)."""

    def __init__(
        self,
        shapes: Mapping[str, torch.Size | tuple[int, ...]],
        seed: int,
        stride: int = DEFAULT_STRIDE,
        max_per_tensor: int = DEFAULT_MAX_PER_TENSOR,
        ranges: Mapping[str, tuple[int, int]] | None = None,
        min_per_tensor: int = 1,
    ) -> None:
        """`shapes`: the whole tensors' shapes; `ranges`: the part of each held here (default: all);
        `min_per_tensor`: the stride shrinks for smaller tensors so that each keeps about that many
        coordinates (all of one that has fewer); the default 1 leaves every tensor at `stride`."""
        self.seed = seed
        self.layout: dict[str, tuple[int, int, int]] = {}  # name -> (offset, stride, numel) of the whole
        self.ranges: dict[str, tuple[int, int]] = {}  # name -> [start, stop) held here, in the whole
        for name, shape in shapes.items():
            numel = math.prod(shape)
            dense = min(stride, numel // max(min_per_tensor, 1))
            step = (
                1 if numel <= min_per_tensor else _next_prime(max(dense, math.ceil(numel / max_per_tensor)))
            )
            offset = zlib.crc32(f"{seed}:{name}".encode()) % min(step, numel) if numel else 0
            self.layout[name] = (offset, step, numel)
            self.ranges[name] = (0, numel) if ranges is None else tuple(ranges[name])
        # where the sample starts in the part held here, and how many coordinates it has there
        self._start = {name: self._first(name) - self.ranges[name][0] for name in self.layout}
        self._count = {
            name: len(range(self._first(name), self.ranges[name][1], self.layout[name][1]))
            for name in self.layout
        }

    def _first(self, name: str) -> int:
        """The first sampled index of the whole tensor at or after the start of the part held here."""
        offset, step, _ = self.layout[name]
        start = self.ranges[name][0]
        return offset + max(0, -(-(start - offset) // step)) * step

    def gather(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """The sampled coordinates of `tensor`: the whole tensor, or the shard that `ranges` describes.

        A contiguous tensor's sample is one `as_strided` view (this runs for every tensor at every
        observed step, so the flatten-then-slice of the general case is worth saving)."""
        tensor = tensor.detach()
        start, count = self._start[name], self._count[name]
        if count and tensor.is_contiguous():
            return tensor.as_strided((count,), (self.layout[name][1],), tensor.storage_offset() + start)
        return tensor.reshape(-1)[start :: self.layout[name][1]]

    def count(self, name: str) -> int:
        return self._count[name]

    @property
    def fraction(self) -> float:
        """Share of the coordinates held here that are sampled."""
        total = sum(stop - start for start, stop in self.ranges.values())
        return sum(self.count(name) for name in self.layout) / max(total, 1)
