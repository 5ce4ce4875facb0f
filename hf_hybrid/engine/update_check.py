"""The update check: an applied update many times the size of the recent ones that made the very batch
it was computed on worse has overshot, and is taken back (the weights and the optimizer state of before
the step are put back, as if the step had been skipped).

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

It keeps one copy of what training changes (the trainable weights and their optimizer state), taken
before every guarded step; the spike guard runs it only where that copy is cheap (`SpikeGuard`).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import torch

from .sharding import is_sharded, local


class _Copy(Protocol):
    """What the check keeps the state before the step in (a `spike_guard.HostCopy`)."""

    params: list[torch.Tensor]

    def take(self, step: int, params: list[torch.Tensor], optimizer: Any) -> None: ...

    def restore(self, params: list[torch.Tensor], optimizer: Any) -> None: ...

    def swap(self, params: list[torch.Tensor]) -> bool: ...

    def clear(self) -> None: ...

    def nbytes(self) -> int: ...

    def tensors(self) -> Any: ...


class UpdateCheck:
    """Judges each guarded step's applied update against the recent ones (see the module docstring).

    `max_ratio` 0 turns it off. `suspect_loss()`: this step's batch's loss at the live weights, measured
    again without a gradient and with the random state it had before (None: it cannot be). Every rank
    holds the same weights (sharded parameters turn the check off: their norms differ by rank)."""

    def __init__(
        self,
        params: list[torch.Tensor],
        optimizer: Any,
        before: _Copy,
        *,
        max_ratio: float,
        history: int,
        min_history: int,
        suspect_loss: Callable[[], float | None] | None,
    ) -> None:
        self.params = params
        self.optimizer = optimizer
        self.before = before
        self.max_ratio = max_ratio
        self.min_history = min_history
        self.suspect_loss = suspect_loss
        self.norms: deque[float] = deque(maxlen=history)
        self.on = bool(params) and max_ratio > 0 and not any(is_sharded(p) for p in params)
        self.largest_ratio = 0.0  # how close a left update came to the limit (reported, not judged)
        self.taken = False  # the copy holds this step's state before its update

    def take(self, step: int) -> None:
        """Before the optimizer runs: keep the state it is about to change."""
        self.taken = self.on
        if self.on:
            self.before.take(step, self.params, self.optimizer)

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

    def take_back(self) -> None:
        """Put back the weights and optimizer state of before the step."""
        self.before.restore(self.params, self.optimizer)
        self.taken = False

    def cost_seconds(self, clock: Callable[[], float]) -> float:
        """What the check adds to a step (its copy and the update's norm), timed once."""
        cuda = any(p.device.type == "cuda" for p in self.params)
        if cuda:
            torch.cuda.synchronize()
        started = clock()
        self.before.take(0, self.params, self.optimizer)
        self._update_norm()
        if cuda:
            torch.cuda.synchronize()
        return clock() - started

    def turn_off(self) -> None:
        """No more checks; the copy's memory is freed."""
        self.on = self.taken = False
        self.before.clear()

    @torch.no_grad()
    def _update_norm(self) -> float:
        now = [local(p).detach() for p in self.params]
        held = [h.to(n.device, non_blocking=True) for h, n in zip(self.before.params, now, strict=True)]
        deltas = torch._foreach_sub(now, held)
        return float(torch.stack([d.float() for d in torch._foreach_norm(deltas)]).norm())

    def _ratio(self, norm: float) -> float:
        if len(self.norms) < self.min_history:
            return 0.0
        median = statistics.median(self.norms)
        return norm / median if median > 0 else 0.0

    def _paired_losses(self) -> tuple[float, float] | None:
        """The step's batch's loss at the weights after the step and before it, or None."""
        if self.suspect_loss is None:
            return None
        after = self.suspect_loss()
        if after is None or not self.before.swap(self.params):
            return None
        try:
            before = self.suspect_loss()
        finally:
            self.before.swap(self.params)
        if before is None or not (math.isfinite(after) and math.isfinite(before)):
            return None
        return after, before

    def state_dict(self) -> dict[str, Any]:
        return {"norms": list(self.norms), "on": self.on, "largest_ratio": self.largest_ratio}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.norms = deque((float(v) for v in state["norms"]), maxlen=self.norms.maxlen)
        self.on = bool(state["on"]) and self.on
        self.largest_ratio = float(state.get("largest_ratio", 0.0))
