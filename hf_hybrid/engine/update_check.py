"""The update check: an applied update many times the size of the recent ones that did harm is taken
back (the weights of before the step are put back, as if its update had been clipped to nothing), or,
where its learning rate jumped, kept at the rate of the last kept update.

Why: a few outsized updates can damage the weights by less than the loss's batch noise (an lr x30
burst on `decoder_lora`: +6% step loss, 1.5 noise units), while the update's size is not noisy (with
Adam, the burst's first step is ~30x the recent ones; `benchmarks/README.md`, "The spike guard").
Size alone would also take back a schedule's own jump, so an outsized update is judged by what it did:

- its own batch, measured again after and before the step: an update computed from this very batch that
  still made it worse has overshot and is taken back at once;
- otherwise a learning-rate jump opens an *excursion*: back down within `MAX_EXCURSION` steps (a burst)
  and the whole excursion is taken back; still up after that (a schedule's new level) and it stays.

A take-back where the rate jumped keeps the step: with Adam, AdamW's decoupled decay, SGD and their
8-bit forms the applied update is linear in the rate and the optimizer's state is the same at any rate,
so the copy plus (live - copy) x kept rate / rate is the step the run takes without the jump (per
parameter group; for an excursion, the rates summed over its steps). Discarding the step instead cost a
40-step run 3-4 of its steps, more than the burst itself (`benchmarks/README.md`, "The spike guard").

It costs a sample of the coordinates (`update_sample.py`) on every step with a sign and on every
`MEASURE_EVERY`-th other one, which is all the recent sizes' median needs (on the 2x64 GPT-2, whose step
is the shortest, the sample read every step was half the guard's share); the whole weights are copied
only on a sign (a learning rate over `LR_JUMP`x the last kept one, a gradient norm over `GRAD_JUMP`x the
recent median: with Adam a gradient spike moves the update by at most ~3.2x, so that sign is for SGD). The
optimizer keeps what it learnt from the gradient (copying its state would cost 3x with Adam). Whether it
runs is decided from bytes, never timings, so a resumed run judges as the uninterrupted one.
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
MEASURE_EVERY = 2  # once `min_history` sizes are kept, a step without a sign is measured this often


class UpdateCheck:
    """Judges each guarded step's applied update against the recent ones (see the module docstring).
    `max_ratio` 0 turns it off; `suspect_loss()`: this step's batch's loss at the live weights (or None)."""

    def __init__(
        self,
        params: list[torch.Tensor],
        *,
        max_ratio: float,
        history: int,
        min_history: int,
        suspect_loss: Callable[[], float | None] | None,
        device: str = "cpu",
        groups: list[int] | None = None,
    ) -> None:
        """`groups[i]`: the optimizer's parameter group of `params[i]` (None: all in the first)."""
        self.params = params
        self.groups = groups if groups is not None else [0] * len(params)
        self.max_ratio = max_ratio
        self.min_history = min_history
        self.suspect_loss = suspect_loss
        self.device = device
        # the recent sizes of `history` steps, measured every `MEASURE_EVERY`-th
        self.norms: deque[float] = deque(maxlen=max(min_history, history // MEASURE_EVERY))
        self.kept_lrs: list[float | None] = []  # the learning rates of the last update kept
        self.on = bool(params) and max_ratio > 0
        self.largest_ratio = 0.0  # how close a left update came to the limit (reported, not judged)
        self.copies = 0  # steps whose weights were copied (a sign of an outsized update before them)
        self.unjudged = 0  # outsized updates left because nothing before them gave a sign (no copy)
        self.excursion: int | None = None  # the first step of an open excursion (its weights copied)
        self.excursion_outsized = False  # an update of the open excursion was over `max_ratio`
        self.undone: tuple[int, int] | None = None  # the excursion's steps a take-back now undoes
        self.excursion_rates: list[float | None] = []  # per group, the open excursion's rates summed
        self.excursion_steps = 0
        self.scales: list[float] | None = None  # per group, the share of the update a take-back keeps
        self.taken = False  # the sample holds the coordinates of before this step's update
        self.copied = False  # the copy holds the weights of before this step's update (or excursion)
        self.copy: list[torch.Tensor] = []
        self._nbytes = 0
        self.sample: UpdateSample | None = None
        self._step: tuple[int, list[float | None], float | None] = (0, [], None)  # step, lrs, grad ratio

    @torch.no_grad()
    def take(self, step: int, lrs: list[float | None] | None = None, grad_ratio: float | None = None) -> None:
        """Before the optimizer runs: keep the sample of the weights, and the whole weights when `lrs` or
        `grad_ratio` (gradient norm over the recent median) show a sign of an outsized update."""
        self.copied = self.excursion is not None
        self.taken = False
        if not self.on:
            return
        if self.sample is None:
            self._allocate()
        self._step = (step, list(lrs or []), grad_ratio)
        sign = self.excursion is None and self._may_overshoot()
        if not (sign or self.copied or self._measures(step)):
            self.kept_lrs = self._step[1]  # no sign: the update stays, unjudged as a measured one would
            return
        self.taken = True
        self.sample.keep()
        if sign:
            torch._foreach_copy_(self.copy, self.sample.live, non_blocking=self.copy[0].is_pinned())
            self.copied = True
            self.copies += 1

    def judge(self, can_take_back: bool = True) -> str | None:
        """After the optimizer ran: why its update (or the excursion it closes) must be taken back (None:
        it stays, and its size joins the recent ones)."""
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
        """Outside an excursion: an outsized update that raised its own batch's loss is taken back; a
        learning-rate jump opens an excursion."""
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
                jumped = not self._lr_unread() and self._lr_jumped()
                self.scales = self._scales(self._step[1], 1) if jumped else None
                return (
                    f"the update is {ratio:.0f}x the median of the recent ones and raised its own batch's "
                    f"loss from {before:.4g} to {after:.4g}"
                )
        if self.copied and not self._lr_unread() and self._lr_jumped():
            self.excursion, self.excursion_outsized = self._step[0], ratio > self.max_ratio
            self.excursion_rates, self.excursion_steps = list(self._step[1]), 1
            logger.info(
                "hf_hybrid: step %d: the learning rate jumped over %gx that of the last kept update (this "
                "update %.1fx the recent ones): kept while it stays up, taken back to the kept rate if it "
                "comes down within %d steps after an update over %gx",
                self._step[0],
                LR_JUMP,
                ratio,
                MAX_EXCURSION,
                self.max_ratio,
            )
        return None

    def _excursion_verdict(self, ratio: float, can_take_back: bool) -> str | None:
        """The learning rate back down after an outsized update takes the excursion back whole if this
        step's batch (unseen by it) does worse than before it; else it stays."""
        first, step = self.excursion, self._step[0]
        self.excursion_outsized |= ratio > self.max_ratio
        self.excursion_rates = [
            None if total is None or now is None else total + now
            for total, now in zip(self.excursion_rates, self._step[1], strict=False)
        ]
        self.excursion_steps += 1
        if not self._lr_jumped():
            self.excursion = None
            measured = self._paired_losses() if self.excursion_outsized and can_take_back else None
            if measured is None or measured[0] <= measured[1]:
                return None
            self.undone = (first, step)
            self.scales = self._scales(self.excursion_rates, self.excursion_steps)
            return (
                f"the learning rate came back down at step {step} after an excursion from step {first} "
                f"with updates over {self.max_ratio:g}x the recent ones, and this step's batch does worse "
                f"after it ({measured[0]:.4g}) than before it ({measured[1]:.4g}): the {step - first + 1} "
                f"updates since are taken back ("
                + ("redone at the last kept rate)" if self.scales else f"the weights of before step {first})")
            )
        if step - first + 1 >= MAX_EXCURSION:
            self.excursion, self.copied = None, False
            logger.info("hf_hybrid: step %d: the learning rate stayed up since step %d: kept", step, first)
        return None

    @torch.no_grad()
    def take_back(self) -> tuple[list[int], bool]:
        """Put back the weights of before the step (or excursion), or, where its rate jumped, keep its
        update at the last kept update's rate; the steps undone, and whether they were kept so."""
        scaled = self.scales is not None
        if scaled:
            self._scale_back(self.scales)
        else:
            self.put_back()
        first, last = self.undone or (self._step[0], self._step[0])
        self.taken = self.copied = False
        self.undone = self.scales = None
        return list(range(first, last + 1)), scaled

    def before_excursion(self) -> ExcursionCopy | None:
        """The copy of the weights from before the first step of the open excursion, or of the one this
        step's verdict takes back (None: neither)."""
        if self.undone is not None:
            return ExcursionCopy(self, self.undone[0] - 1)
        if self.excursion is None or not self.copied:
            return None
        return ExcursionCopy(self, self.excursion - 1)

    @torch.no_grad()
    def put_back(self) -> None:
        """The live weights become the copy's (the optimizer's state is left as it is)."""
        torch._foreach_copy_(self.sample.live, self.copy)

    @torch.no_grad()
    def _scale_back(self, scales: list[float]) -> None:
        """live = copy + (live - copy) x the share of its group (the update at the kept rate)."""
        for live, kept, group in zip(self.sample.live, self.copy, self.groups, strict=True):
            before = kept.to(live.device, non_blocking=kept.is_pinned())
            live.sub_(before).mul_(scales[group]).add_(before)

    def _scales(self, rates: list[float | None], steps: int) -> list[float] | None:
        """Per group, the share of the update that `steps` updates at the last kept rate would have made,
        of the one made at `rates` (summed over those steps); None where a rate is unknown."""
        kept = self.kept_lrs
        if len(rates) != len(kept) or any(r is None or k is None for r, k in zip(rates, kept, strict=True)):
            return None
        return [min(1.0, steps * k / r) if r > 0 else 1.0 for r, k in zip(rates, kept, strict=True)]

    @torch.no_grad()
    def swap(self) -> None:
        """Exchange the copy's weights with the live ones (twice restores both, bit for bit)."""
        for buf, live in zip(self.copy, self.sample.live, strict=True):
            kept = live.clone()
            live.copy_(buf)
            buf.copy_(kept)

    def end_excursion(self) -> None:
        """The weights were replaced or saved (a checkpoint holds no copy): an open excursion ends, and a
        take-back decided for it is moot."""
        self.excursion = self.undone = self.scales = None
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

    def _measures(self, step: int) -> bool:
        """A step without a sign is measured while the recent sizes are too few, then every
        `MEASURE_EVERY`-th (by its number, so a resumed run measures the same steps)."""
        return len(self.norms) < self.min_history or step % MEASURE_EVERY == 0

    def _may_overshoot(self) -> bool:
        """This step shows a sign that its update may be outsized: its weights are worth copying."""
        if len(self.norms) < self.min_history:
            return False
        grad_ratio = self._step[2]
        return self._lr_unread() or self._lr_jumped() or (grad_ratio is not None and grad_ratio > GRAD_JUMP)

    def _allocate(self) -> None:
        """The copy's buffers (all at once, as the storage plan counted them) and the sample."""
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
        """The step's batch's loss at the weights after the step and at the copy's, or None."""
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


class ExcursionCopy:
    """The update check's copy from before an open excursion, as a restore's source (`Restorable`): the
    weights after `step`, without the optimizer's state, which keeps what it learnt (as a take-back)."""

    def __init__(self, check: UpdateCheck, step: int) -> None:
        self.check = check
        self.step: int | None = step

    def available(self) -> str | None:
        return None

    def swap(self, params: list[torch.Tensor]) -> bool:
        self.check.swap()
        return True

    def restore(self, params: list[torch.Tensor], optimizer: Any) -> None:
        self.check.put_back()
