"""A fixed, seeded sample of each trainable tensor's coordinates: what the sleeping engine watches.

While its predictions are far from useful the engine does not need the whole real update to know it:
the skill `1 - ||s*p - d||^2 / ||d||^2` of a guess is a ratio of sums over coordinates, and a uniform
sample of the coordinates estimates it. So the sleeping engine keeps its buffers for the sampled
coordinates only (no full-size copy of the parameters, no full-size predictor state).

The sample is systematic: every `stride`-th element of the flattened tensor from a seeded offset, with
a prime stride (so rows of a matrix are not sampled in lockstep) and at most `max_per_tensor` elements.
It is a strided view, not an index tensor, so it costs no memory of its own; it depends only on the
seed, the name and the shape, so every rank samples the same coordinates and a resumed run recomputes
it exactly.
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
    ) -> None:
        self.seed = seed
        self.layout: dict[str, tuple[int, int, int]] = {}  # name -> (offset, stride, numel)
        for name, shape in shapes.items():
            numel = math.prod(shape)
            step = _next_prime(max(stride, math.ceil(numel / max_per_tensor)))
            offset = zlib.crc32(f"{seed}:{name}".encode()) % min(step, numel) if numel else 0
            self.layout[name] = (offset, step, numel)

    def gather(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        offset, step, _ = self.layout[name]
        return tensor.detach().reshape(-1)[offset::step]

    def count(self, name: str) -> int:
        offset, step, numel = self.layout[name]
        return len(range(offset, numel, step))

    @property
    def fraction(self) -> float:
        """Share of all coordinates that are sampled."""
        total = sum(numel for _, _, numel in self.layout.values())
        return sum(self.count(name) for name in self.layout) / max(total, 1)
