"""The update check: an applied update many times the size of the recent ones that did harm is taken
back (the weights of before the step are put back, as if its update had been clipped to nothing).

Why the spike guard needs it: a few outsized updates can damage the weights by less than the batch noise
of the loss. On `decoder_lora` an lr x30 burst raised the step loss by 6%, 1.5 noise units of one step,
which no loss test tells from noise without firing on clean runs too, and the run ended 0.016 worse. The
update's size is not noisy: with Adam it is the learning rate times a quantity that changes slowly from
step to step, so the burst's first step is about 30 times the recent ones, while a clean run's steps stay
within a few times of each other (`benchmarks/README.md`, "The spike guard", has the measured ratios).

Size alone would also take back a schedule's own jump (a cosine restart). So an outsized update is
judged by what it did, two ways:

- its own batch: the step's batch is measured again at the weights after the step and at the weights
  before it (the same dropout draws for both). An update that the optimizer computed from this very batch
  and still made it worse has overshot: it is taken back at once.
- the learning rate's excursion: an outsized update that lowered its batch's loss (30 times further
  along one batch's gradient can still fit that batch: a classifier's adapter, a tiny model) opens an
  *excursion*. The weights of before it stay copied, and the excursion is judged by where the learning
  rate goes: back down within `MAX_EXCURSION` steps (a burst: a scheduler bug, a callback's edit of the
  param groups, a user's own lr logic gone wrong) and the whole excursion is taken back, the step that
  came back included (its gradient was taken at the damaged weights); still up after that (a schedule's
  new level) and it stays, the new rate the normal one. The learning rates are read from the optimizer's
  param groups right before each step, so a change is seen however it was made.

What it costs per step is a sample of the weights' coordinates (`update_sample.py`). The whole weights
are copied before a step only where it shows a sign that its update may be outsized: a learning rate over
`LR_JUMP` times that of the last update kept, or a gradient norm over `GRAD_JUMP` times the recent median
(the spike guard's detector's window). With Adam nothing else can make an update ten times the recent
ones: a gradient spike of any size moves its update by at most about (1 - beta1) / sqrt(1 - beta2), 3.2x
with the defaults, so the gradient's sign is for plain SGD. An optimizer without a learning rate in its
groups has its weights copied every step. Taking an update back puts the weights back bit for bit; the
optimizer keeps what it learnt from the step's gradient (Adam's moments and step count move on, as for a
step whose update was clipped to nothing): a copy of the optimizer state would cost three times as much
with Adam. Whether it runs is decided before training from bytes (its copy must fit the guard's memory
budget, `guard_storage.py`), never from a timing, so a resumed run judges as the uninterrupted one.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from .update_sample import UpdateSample

logger = logging.getLogger(__name__)

LR_JUMP = 2.0  # a learning rate this many times the last kept update's: the weights are copied first
GRAD_JUMP = 3.0  # a gradient norm this many times the recent median: the weights are copied first
MAX_EXCURSION = 8  # steps a raised learning rate may last and still be a burst taken back whole


class UpdateCheck:
    """Judges each guarded step's applied update against the recent ones (see the module docstring).

    `max_ratio` 0 turns it off. `suspect_loss()`: this step's batch's loss at the live weights, measured
    again without a gradient and with the random state it had before (None: it cannot be). `device`:
    where the copy lives ("cpu": host memory, pinned under CUDA; "same": the weights' device). Sharded
    parameters are judged on every rank alike (the norm is summed over the ranks' shards)."""

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
        self.on = bool(params) and max_ratio > 0
        self.largest_ratio = 0.0  # how close a left update came to the limit (reported, not judged)
        self.copies = 0  # steps whose weights were copied (a sign of an outsized update before them)
        self.unjudged = 0  # outsized updates left because nothing before them gave a sign (no copy)
        self.excursion: int | None = None  # the first step of an open excursion (its weights copied)
        self.excursion_outsized = False  # an update of the open excursion was over `max_ratio`
        self.undone: tuple[int, int] | None = None  # the excursion's steps a take-back now undoes
        self.taken = False  # the sample holds the coordinates of before this step's update
        self.copied = False  # the copy holds the weights of before this step's update (or excursion)
        self.copy: list[torch.Tensor] = []
        self._nbytes = 0
        self.sample: UpdateSample | None = None
        self._step: tuple[int, list[float | None], float | None] = (0, [], None)  # step, lrs, grad ratio

    @torch.no_grad()
    def take(self, step: int, lrs: list[float | None] | None = None, grad_ratio: float | None = None) -> None:
        """Before the optimizer runs: keep the sample of the weights it is about to change, and the whole
        weights when `lrs` (each group's) or `grad_ratio` (this step's gradient norm over the recent
        median, as the caller keeps it; None: not known) show a sign that the update may be outsized
        (during an excursion the copy keeps the weights of before it)."""
        self.taken = self.on
        self.copied = self.excursion is not None
        if not self.on:
            return
        if self.sample is None:
            self._allocate()
        self._step = (step, list(lrs or []), grad_ratio)
        self.sample.keep()
        if self.excursion is None and self._may_overshoot():
            torch._foreach_copy_(self.copy, self.sample.live, non_blocking=self.copy[0].is_pinned())
            self.copied = True
            self.copies += 1

    def judge(self, can_take_back: bool = True) -> str | None:
        """After the optimizer ran: why its update (or the excursion it closes) must be taken back (None:
        it stays, and its size joins the recent ones). `can_take_back=False`: it stays whatever it is.
        During an excursion its updates are judged by where the learning rate goes, not one by one."""
        if not self.taken:
            return None
        norm = self.sample.update_norm()
        ratio = self._ratio(norm)
        if self.excursion is not None:
            why = self._excursion_verdict(ratio, can_take_back)
        else:
            why = self._judge_step(ratio, can_take_back)
        if why is not None:
            return why
        if math.isfinite(norm):
            self.norms.append(norm)
            self.largest_ratio = max(self.largest_ratio, ratio if math.isfinite(ratio) else 0.0)
        if self.excursion is None:
            self.kept_lrs = self._step[1]
        return None

    def _judge_step(self, ratio: float, can_take_back: bool) -> str | None:
        """An update outside an excursion: one over `max_ratio` times the recent ones is taken back if it
        raised its own batch's loss; one whose learning rate jumped and stays opens an excursion."""
        outsized = ratio > self.max_ratio and can_take_back
        if outsized and not self.copied:
            self.unjudged += 1
            logger.info(
                "hf_hybrid: an update %.0fx the median of the recent ones stays unjudged: neither its "
                "learning rate nor its gradient norm gave a sign of it, so its weights were not copied",
                ratio,
            )
        elif outsized:
            measured = self._paired_losses()
            if measured is not None and measured[0] > measured[1]:
                after, before = measured
                return (
                    f"the update is {ratio:.0f}x the median of the recent ones and raised its own batch's "
                    f"loss from {before:.4g} to {after:.4g}"
                )
        if self.copied and not self._lr_unread() and self._lr_jumped():
            self.excursion, self.excursion_outsized = self._step[0], ratio > self.max_ratio
            logger.info(
                "hf_hybrid: step %d: the learning rate jumped over %gx that of the last kept update (this "
                "update %.1fx the recent ones): kept while it stays up, taken back whole if it comes down "
                "within %d steps after an update over %gx",
                self._step[0],
                LR_JUMP,
                ratio,
                MAX_EXCURSION,
                self.max_ratio,
            )
        return None

    def _excursion_verdict(self, ratio: float, can_take_back: bool) -> str | None:
        """An open excursion: the learning rate back down after an outsized update (a burst) takes it back
        whole if the weights now do worse than those of before it on this step's batch, one the excursion's
        updates never saw; still up after `MAX_EXCURSION` steps (a new level), back without any outsized
        update, or back having done good keeps it, the rate then the normal one."""
        first, step = self.excursion, self._step[0]
        self.excursion_outsized |= ratio > self.max_ratio
        if not self._lr_jumped():
            self.excursion = None
            measured = self._paired_losses() if self.excursion_outsized and can_take_back else None
            if measured is None or measured[0] <= measured[1]:
                return None
            self.undone = (first, step)
            return (
                f"the learning rate came back down at step {step} after an excursion from step {first} "
                f"with updates over {self.max_ratio:g}x the recent ones, and this step's batch does worse "
                f"after it ({measured[0]:.4g}) than before it ({measured[1]:.4g}): the {step - first + 1} "
                f"updates since are taken back (the weights of before step {first})"
            )
        if step - first + 1 >= MAX_EXCURSION:
            self.excursion, self.copied = None, False
            logger.info("hf_hybrid: step %d: the learning rate stayed up since step %d: kept", step, first)
        return None

    @torch.no_grad()
    def take_back(self) -> list[int]:
        """Put back the weights of before the step, or of before the excursion it closed; the steps whose
        updates are undone."""
        torch._foreach_copy_(self.sample.live, self.copy)
        first, last = self.undone or (self._step[0], self._step[0])
        self.taken = self.copied = False
        self.undone = None
        return list(range(first, last + 1))

    def end_excursion(self) -> None:
        """The weights were replaced (a restore) or saved (a checkpoint holds no copy): an open excursion
        ends; the rate it opened at is still not the kept one, so a step at it is copied and judged
        again, by a resumed run as by the uninterrupted one."""
        self.excursion = None
        self.copied = False

    def turn_off(self) -> None:
        """No more checks (a run saved with the check off goes on without it); the copy is freed."""
        self.on = self.taken = self.copied = False
        self.copy, self.sample, self._nbytes = [], None, 0

    def nbytes(self) -> int:
        return self._nbytes

    def _lr_jumped(self) -> bool:
        """This step's learning rate of some group is over `LR_JUMP` times that of the last update kept."""
        lrs = self._step[1]
        return any(
            k is None or now is None or now > LR_JUMP * k for now, k in zip(lrs, self.kept_lrs, strict=False)
        )

    def _lr_unread(self) -> bool:
        """No learning rate to read (an optimizer without one, or none kept yet)."""
        lrs = self._step[1]
        return not lrs or not self.kept_lrs or any(lr is None for lr in lrs)

    def _may_overshoot(self) -> bool:
        """This step shows a sign that its update may be outsized (see the module docstring): its weights
        are worth copying. Never before the check can judge (too few updates seen)."""
        if len(self.norms) < self.min_history:
            return False
        grad_ratio = self._step[2]
        return self._lr_unread() or self._lr_jumped() or (grad_ratio is not None and grad_ratio > GRAD_JUMP)

    def _allocate(self) -> None:
        """The copy's buffers (allocated at once, as the storage plan counted them: no surprise later) and
        the sample."""
        self.sample = UpdateSample(self.params)
        live = self.sample.live
        pin = self.device == "cpu" and any(t.device.type == "cuda" for t in live)
        self.copy = [
            torch.empty_like(t, device="cpu" if self.device == "cpu" else t.device, pin_memory=pin)
            for t in live
        ]
        self._nbytes = sum(t.numel() * t.element_size() for t in self.copy)

    def _ratio(self, norm: float) -> float:
        if len(self.norms) < self.min_history:
            return 0.0
        median = statistics.median(self.norms)
        return norm / median if median > 0 else 0.0

    @torch.no_grad()
    def _paired_losses(self) -> tuple[float, float] | None:
        """The step's batch's loss at the weights after the step and at the copy's (before the step, or
        before the excursion), or None."""
        if self.suspect_loss is None:
            return None
        after = self.suspect_loss()
        if after is None:
            return None
        live = self.sample.live
        updated = [t.clone() for t in live]
        torch._foreach_copy_(live, self.copy)
        try:
            before = self.suspect_loss()
        finally:
            torch._foreach_copy_(live, updated)
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
