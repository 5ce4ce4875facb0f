"""A fixed, seeded sample of each trainable tensor's coordinates: what the engine scores its guesses on.

A guess's skill is a ratio of sums over coordinates, so a uniform sample estimates it: the sleeping engine
keeps buffers for the sample only, the awake one scores on a denser one (`min_per_tensor`). Systematic:
every `stride`-th element from a seeded offset, a prime stride (rows not in lockstep); a strided view
(no memory), fixed by seed, name and shape, so every rank and a resumed run sample alike. Sharded, each
rank gathers the sampled coordinates in its `Shard(0)` range: the union is the single process's sample.
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
        """`ranges`: the part of each whole tensor held here (default: all); `min_per_tensor`: the stride
        shrinks so each tensor keeps about that many coordinates (all, if fewer)."""
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
        """The sampled coordinates of `tensor` (whole, or the shard `ranges` describes); a contiguous one's is
        one `as_strided` view (this runs for every tensor at every observed step)."""
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
