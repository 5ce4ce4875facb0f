"""The update check: an applied update many times the size of the recent ones that made the very batch
it was computed on worse has overshot, and is taken back (the weights of before the step are put back,
as if its update had been clipped to nothing).

Why the spike guard needs it: a few outsized updates can damage the weights by less than the batch noise
of the loss. On `decoder_lora` an lr x30 burst raised the step loss by 6%, 1.5 noise units of one step,
which no loss test tells from noise without firing on clean runs too, and the run ended 0.016 worse. The
update's size is not noisy: with Adam it is the learning rate times a quantity that changes slowly from
step to step, so the burst's first step is about 30 times the recent ones, while a clean run's steps stay
within a few times of each other (`benchmarks/README.md`, "The spike guard", has the measured ratios).

Size alone would also take back a schedule's own jump (a cosine restart). So an outsized update is
judged by what it did: the step's batch is measured again at the weights after the step and at the
weights before it (the same dropout draws for both), and only an update that raised that batch's loss is
taken back. An update that the optimizer computed from this very batch and that still made it worse has
overshot. One that lowered it is left, and its size joins the recent ones: the schedule's new normal.

It keeps one copy of the trainable weights, taken before every guarded step, and measures the update on
a fixed sample of their coordinates, the same share of every tensor (an outsized step moves them all);
the spike guard runs it only where that costs little (`SpikeGuard`). Taking an update back puts the
weights back bit for bit; the optimizer keeps what it learnt from the step's gradient (Adam's moments and
step count move on, as for a step whose update was clipped to nothing): a copy of the optimizer state
every step would cost three times as much with Adam.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from .sharding import is_sharded, local

SAMPLE = 16384  # coordinates the update's norm is measured on (the same share of every tensor)


class UpdateCheck:
    """Judges each guarded step's applied update against the recent ones (see the module docstring).

    `max_ratio` 0 turns it off. `suspect_loss()`: this step's batch's loss at the live weights, measured
    again without a gradient and with the random state it had before (None: it cannot be). `device`:
    where the copy lives ("cpu": host memory, pinned under CUDA; "same": the weights' device). Every rank
    holds the same weights (sharded parameters turn the check off: their norms differ by rank)."""

    def __init__(
        self,
        params: list[torch.Tensor],
        *,
        max_ratio: float,
        history: int,
        min_history: int,
        suspect_loss: Callable[[], float | None] | None,
        device: str = "cpu",
    ) -> None:
        self.params = params
        self.max_ratio = max_ratio
        self.min_history = min_history
        self.suspect_loss = suspect_loss
        self.device = device
        self.norms: deque[float] = deque(maxlen=history)
        self.on = bool(params) and max_ratio > 0 and not any(is_sharded(p) for p in params)
        self.largest_ratio = 0.0  # how close a left update came to the limit (reported, not judged)
        self.taken = False  # the copy holds the weights of before this step's update
        self.copy: list[torch.Tensor] = []
        self._scratch: tuple[torch.Tensor, torch.Tensor] = (torch.empty(0), torch.empty(0))  # the samples
        self._mixed = False
        self._contiguous = True
        self._live: list[torch.Tensor] = []
        self._samples: tuple[list[torch.Tensor], list[torch.Tensor]] = ([], [])

    @torch.no_grad()
    def take(self, step: int) -> None:
        """Before the optimizer runs: keep the weights it is about to change."""
        self.taken = self.on
        if not self.on:
            return
        if not self.copy:
            self._allocate()
        torch._foreach_copy_(self.copy, self._live, non_blocking=self.copy[0].is_pinned())

    def judge(self, can_take_back: bool = True) -> str | None:
        """After the optimizer ran: why its update must be taken back (None: it stays, and its size joins
        the recent ones). `can_take_back=False`: it stays whatever it is (too many taken back in a row)."""
        if not self.taken:
            return None
        norm = self._update_norm()
        ratio = self._ratio(norm)
        if ratio > self.max_ratio and can_take_back:
            measured = self._paired_losses()
            if measured is not None and measured[0] > measured[1]:
                after, before = measured
                return (
                    f"the update is {ratio:.0f}x the median of the recent ones and raised its own batch's "
                    f"loss from {before:.4g} to {after:.4g}"
                )
        if math.isfinite(norm):
            self.norms.append(norm)
            self.largest_ratio = max(self.largest_ratio, ratio if math.isfinite(ratio) else 0.0)
        return None

    @torch.no_grad()
    def take_back(self) -> None:
        """Put back the weights of before the step."""
        torch._foreach_copy_(self._live, self.copy)
        self.taken = False

    def cost_seconds(self, clock: Callable[[], float]) -> float:
        """What the check adds to a step (its copy and the update's norm), timed once."""
        cuda = any(p.device.type == "cuda" for p in self.params)
        if cuda:
            torch.cuda.synchronize()
        started = clock()
        self.take(0)
        self._update_norm()
        if cuda:
            torch.cuda.synchronize()
        return clock() - started

    def turn_off(self) -> None:
        """No more checks; the copy's memory is freed."""
        self.on = self.taken = False
        self.copy, self._live, self._samples = [], [], ([], [])
        self._scratch = (torch.empty(0), torch.empty(0))

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.copy)

    def _allocate(self) -> None:
        """The copy's buffers, and the samples of the weights and of the copy that the norm reads."""
        self._live = [local(p).detach() for p in self.params]
        pin = self.device == "cpu" and any(t.device.type == "cuda" for t in self._live)
        self.copy = [
            torch.empty_like(t, device="cpu" if self.device == "cpu" else t.device, pin_memory=pin)
            for t in self._live
        ]
        self._samples = self._sample(self._live, self.copy)
        self._contiguous = all(t.is_contiguous() for t in self._live)  # else sampled afresh each step
        now, held = self._samples
        dtypes = {t.dtype for t in now + held}
        self._mixed = len(dtypes) > 1  # then each sample is cast to fp32 before it is concatenated
        dtype = torch.float32 if self._mixed else dtypes.pop()
        size = sum(t.numel() for t in now)
        self._scratch = (
            torch.empty(size, dtype=dtype, device=now[0].device),
            torch.empty(size, dtype=dtype, device=held[0].device),
        )

    @staticmethod
    def _sample(
        live: list[torch.Tensor], copy: list[torch.Tensor]
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The same share of every tensor, a contiguous run at its start (a strided sample would still read
        every cache line), about `SAMPLE` coordinates in all."""
        total = sum(t.numel() for t in live)
        share = min(1.0, SAMPLE / max(total, 1))
        counts = [max(1, math.ceil(t.numel() * share)) for t in live]
        return (
            [t.reshape(-1)[:n] for t, n in zip(live, counts, strict=True)],
            [c.view(-1)[:n] for c, n in zip(copy, counts, strict=True)],
        )

    @torch.no_grad()
    def _update_norm(self) -> float:
        """The norm of the update on the sample: two concatenations into buffers kept for it, a
        subtraction and a norm, whatever the number of tensors (per-tensor calls would cost a small model
        more than the arithmetic)."""
        now, held = self._samples if self._contiguous else self._sample(self._live, self.copy)
        after, before = self._scratch
        torch.cat([n.float() for n in now] if self._mixed else now, out=after)
        torch.cat([h.float() for h in held] if self._mixed else held, out=before)
        after.sub_(before.to(after.device, non_blocking=True))
        return float(torch.linalg.vector_norm(after, dtype=torch.float32))

    def _ratio(self, norm: float) -> float:
        if len(self.norms) < self.min_history:
            return 0.0
        median = statistics.median(self.norms)
        return norm / median if median > 0 else 0.0

    @torch.no_grad()
    def _paired_losses(self) -> tuple[float, float] | None:
        """The step's batch's loss at the weights after the step and before it, or None."""
        if self.suspect_loss is None:
            return None
        after = self.suspect_loss()
        if after is None:
            return None
        updated = [t.clone() for t in self._live]
        torch._foreach_copy_(self._live, self.copy)
        try:
            before = self.suspect_loss()
        finally:
            torch._foreach_copy_(self._live, updated)
        if before is None or not (math.isfinite(after) and math.isfinite(before)):
            return None
        return after, before

    def state_dict(self) -> dict[str, Any]:
        return {"norms": list(self.norms), "on": self.on, "largest_ratio": self.largest_ratio}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.norms = deque((float(v) for v in state["norms"]), maxlen=self.norms.maxlen)
        if not state["on"]:
            self.turn_off()
        self.largest_ratio = float(state.get("largest_ratio", 0.0))
