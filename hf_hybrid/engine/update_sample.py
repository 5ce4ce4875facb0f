"""The coordinates the update check reads an applied update's norm on: the same share of every trainable
tensor, about `SAMPLE` of them in all, kept before the optimizer runs and subtracted after it.

An outsized step moves every coordinate, so a small sample sees it, at two concatenations and a norm
a step whatever the model's size. Sharded, the squared norm is summed over the ranks (one scalar).
"""

from __future__ import annotations

import math

import torch

from .sharding import ShardGroup, local

SAMPLE = 16384  # coordinates the update's norm is measured on


class UpdateSample:
    """The sample's views of the live weights and the two buffers the norm reads (after, before)."""

    def __init__(self, params: list[torch.Tensor]) -> None:
        self.params = params
        self.shards = ShardGroup.of({str(i): p for i, p in enumerate(params)})
        self.live = [local(p).detach() for p in params]
        self.views = self._sample(self.live)
        self.contiguous = all(t.is_contiguous() for t in self.live)  # else sampled afresh each step
        dtypes = {t.dtype for t in self.views}
        self.mixed = len(dtypes) > 1  # then each sample is cast to fp32 before it is concatenated
        dtype = torch.float32 if self.mixed or not dtypes else dtypes.pop()
        size = sum(t.numel() for t in self.views)
        device = self.views[0].device if self.views else torch.device("cpu")
        self.after = torch.empty(size, dtype=dtype, device=device)
        self.before = torch.empty(size, dtype=dtype, device=device)

    @staticmethod
    def _sample(live: list[torch.Tensor]) -> list[torch.Tensor]:
        """The same share of every tensor, a contiguous run at its start (a strided sample would still read
        every cache line)."""
        total = sum(t.numel() for t in live)
        share = min(1.0, SAMPLE / max(total, 1))
        counts = [max(1, math.ceil(t.numel() * share)) for t in live]
        return [t.reshape(-1)[:n] for t, n in zip(live, counts, strict=True)]

    def _concat(self, out: torch.Tensor) -> None:
        """The sample's coordinates as they are now, into `out`."""
        now = self.views if self.contiguous else self._sample(self.live)
        torch.cat([n.float() for n in now] if self.mixed else now, out=out)

    @torch.no_grad()
    def keep(self) -> None:
        """Before the optimizer runs."""
        self._concat(self.before)

    @torch.no_grad()
    def update_norm(self) -> float:
        """After it: the norm of the update on the sample (summed over the ranks' shards)."""
        self._concat(self.after)
        self.after.sub_(self.before)
        squared = torch.linalg.vector_norm(self.after, dtype=torch.float32) ** 2
        return math.sqrt(max(self.shards.sum([squared])[0], 0.0))
