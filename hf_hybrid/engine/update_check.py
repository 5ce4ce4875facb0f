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

What it costs per step is a sample of the weights' coordinates (the same share of every tensor, an
outsized step moves them all), kept before the step and subtracted after it. The whole weights are
copied before a step only where it shows a sign that its update may be outsized: a learning rate over
`LR_JUMP` times that of the last update kept, or a gradient norm over `GRAD_JUMP` times the recent median.
With Adam nothing else can make an update ten times the recent ones: a gradient spike of any size moves
its update by at most about (1 - beta1) / sqrt(1 - beta2), 3.2x with the defaults, so the gradient's sign
is for plain SGD. An optimizer without a learning rate in its groups has its weights copied every step.
Copying every step cost up to 0.3% of a full fine-tune's step on CPU, over the share the guard allows
it, so the check had turned itself off on exactly the runs with the most to lose, and on a loaded
machine on others. Taking an update back puts the weights back bit for bit; the optimizer keeps what it
learnt from the step's gradient (Adam's moments and step count move on, as for a step whose update was
clipped to nothing): a copy of the optimizer state would cost three times as much with Adam.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from .sharding import is_sharded, local

logger = logging.getLogger(__name__)

SAMPLE = 16384  # coordinates the update's norm is measured on (the same share of every tensor)
LR_JUMP = 2.0  # a learning rate this many times the last kept update's: the weights are copied first
GRAD_JUMP = 3.0  # a gradient norm this many times the recent median: the weights are copied first


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
        self.kept_lrs: list[float | None] = []  # the learning rates of the last update kept
        self.on = bool(params) and max_ratio > 0 and not any(is_sharded(p) for p in params)
        self.largest_ratio = 0.0  # how close a left update came to the limit (reported, not judged)
        self.copies = 0  # steps whose weights were copied (a sign of an outsized update before them)
        self.unjudged = 0  # outsized updates left because nothing before them gave a sign (no copy)
        self.taken = False  # the sample holds the coordinates of before this step's update
        self.copied = False  # the copy holds the weights of before this step's update
        self.copy: list[torch.Tensor] = []
        self._scratch: tuple[torch.Tensor, torch.Tensor] = (torch.empty(0), torch.empty(0))  # after, before
        self._mixed = False
        self._contiguous = True
        self._live: list[torch.Tensor] = []
        self._samples: list[torch.Tensor] = []
        self._step: tuple[list[float | None], float | None] = ([], None)  # this step's lrs and grad ratio

    @torch.no_grad()
    def take(self, step: int, lrs: list[float | None] | None = None, grad_ratio: float | None = None) -> None:
        """Before the optimizer runs: keep the sample of the weights it is about to change, and the whole
        weights when `lrs` (each group's) or `grad_ratio` (this step's gradient norm over the recent
        median, as the caller keeps it; None: not known) show a sign that the update may be outsized."""
        self.taken = self.on
        self.copied = False
        if not self.on:
            return
        if not self.copy:
            self._allocate()
        self._step = (list(lrs or []), grad_ratio)
        self._keep_sample()
        if self._may_overshoot():
            torch._foreach_copy_(self.copy, self._live, non_blocking=self.copy[0].is_pinned())
            self.copied = True
            self.copies += 1

    def judge(self, can_take_back: bool = True) -> str | None:
        """After the optimizer ran: why its update must be taken back (None: it stays, and its size joins
        the recent ones). `can_take_back=False`: it stays whatever it is (too many taken back in a row)."""
        if not self.taken:
            return None
        norm = self._update_norm()
        ratio = self._ratio(norm)
        if ratio > self.max_ratio and can_take_back:
            if not self.copied:
                self.unjudged += 1
                logger.info(
                    "hf_hybrid: an update %.0fx the median of the recent ones stays unjudged: neither its "
                    "learning rate nor its gradient norm gave a sign of it, so its weights were not copied",
                    ratio,
                )
            else:
                measured = self._paired_losses()
                if measured is not None and measured[0] > measured[1]:
                    after, before = measured
                    return (
                        f"the update is {ratio:.0f}x the median of the recent ones and raised its own "
                        f"batch's loss from {before:.4g} to {after:.4g}"
                    )
        if math.isfinite(norm):
            self.norms.append(norm)
            self.largest_ratio = max(self.largest_ratio, ratio if math.isfinite(ratio) else 0.0)
        self.kept_lrs = self._step[0]
        return None

    @torch.no_grad()
    def take_back(self) -> None:
        """Put back the weights of before the step (only a copied step is ever judged outsized)."""
        torch._foreach_copy_(self._live, self.copy)
        self.taken = self.copied = False

    def cost_seconds(self, clock: Callable[[], float], repeats: int = 5) -> float:
        """What the check adds to an ordinary step (its sample and the update's norm): the fastest of
        `repeats` timings, as one timing on a loaded machine can catch a pause that is not the check's
        (the check turned itself off so on a 2-core machine running three jobs)."""
        if not self.copy:
            self._allocate()
        cuda = any(p.device.type == "cuda" for p in self.params)
        times = []
        for _ in range(repeats):
            if cuda:
                torch.cuda.synchronize()
            started = clock()
            self._keep_sample()
            self._update_norm()
            if cuda:
                torch.cuda.synchronize()
            times.append(clock() - started)
        return min(times)

    def turn_off(self) -> None:
        """No more checks; the copy's memory is freed."""
        self.on = self.taken = self.copied = False
        self.copy, self._live, self._samples = [], [], []
        self._scratch = (torch.empty(0), torch.empty(0))

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.copy)

    def _may_overshoot(self) -> bool:
        """This step shows a sign that its update may be outsized (see the module docstring): its weights
        are worth copying. Never before the check can judge (too few updates seen)."""
        if len(self.norms) < self.min_history:
            return False
        lrs, grad_ratio = self._step
        if not lrs or not self.kept_lrs or any(lr is None for lr in lrs):
            return True  # no learning rate to read: copied every step
        if any(k is None or now > LR_JUMP * k for now, k in zip(lrs, self.kept_lrs, strict=False)):
            return True
        return grad_ratio is not None and grad_ratio > GRAD_JUMP

    def _allocate(self) -> None:
        """The copy's buffers (allocated at once, as the storage plan counted them: no surprise later),
        the sample's views of the weights, and the buffers the norm reads."""
        self._live = [local(p).detach() for p in self.params]
        pin = self.device == "cpu" and any(t.device.type == "cuda" for t in self._live)
        self.copy = [
            torch.empty_like(t, device="cpu" if self.device == "cpu" else t.device, pin_memory=pin)
            for t in self._live
        ]
        self._samples = self._sample(self._live)
        self._contiguous = all(t.is_contiguous() for t in self._live)  # else sampled afresh each step
        dtypes = {t.dtype for t in self._samples}
        self._mixed = len(dtypes) > 1  # then each sample is cast to fp32 before it is concatenated
        dtype = torch.float32 if self._mixed else dtypes.pop()
        size = sum(t.numel() for t in self._samples)
        device = self._samples[0].device
        self._scratch = (
            torch.empty(size, dtype=dtype, device=device),
            torch.empty(size, dtype=dtype, device=device),
        )

    @staticmethod
    def _sample(live: list[torch.Tensor]) -> list[torch.Tensor]:
        """The same share of every tensor, a contiguous run at its start (a strided sample would still read
        every cache line), about `SAMPLE` coordinates in all."""
        total = sum(t.numel() for t in live)
        share = min(1.0, SAMPLE / max(total, 1))
        counts = [max(1, math.ceil(t.numel() * share)) for t in live]
        return [t.reshape(-1)[:n] for t, n in zip(live, counts, strict=True)]

    def _concat(self, out: torch.Tensor) -> None:
        """The sample's coordinates as they are now, into `out`: one concatenation, whatever the number
        of tensors (per-tensor calls would cost a small model more than the arithmetic)."""
        now = self._samples if self._contiguous else self._sample(self._live)
        torch.cat([n.float() for n in now] if self._mixed else now, out=out)

    @torch.no_grad()
    def _keep_sample(self) -> None:
        self._concat(self._scratch[1])

    @torch.no_grad()
    def _update_norm(self) -> float:
        """The norm of the update on the sample."""
        after, before = self._scratch
        self._concat(after)
        after.sub_(before)
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
        return {
            "norms": list(self.norms),
            "kept_lrs": list(self.kept_lrs),
            "on": self.on,
            "largest_ratio": self.largest_ratio,
            "copies": self.copies,
            "unjudged": self.unjudged,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.norms = deque((float(v) for v in state["norms"]), maxlen=self.norms.maxlen)
        self.kept_lrs = [None if v is None else float(v) for v in state.get("kept_lrs", [])]
        if not state["on"]:
            self.turn_off()
        self.largest_ratio = float(state.get("largest_ratio", 0.0))
        self.copies = int(state.get("copies", 0))
        self.unjudged = int(state.get("unjudged", 0))
