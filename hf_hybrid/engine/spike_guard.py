"""The spike guard: a loss spike in a real step is blamed on the batch or on the weights before anything
is done about it, and only what is to blame is undone.

What large runs do by hand, on the fly and through the engine's one recovery rule (`recovery.py`):
copies of the weights and optimizer state every `every` clean steps (`copy_schedule.py`); a spike
detector (`spike_detector.py`); blame before acting (`spike_blame.py`: bad data skipped, damaged weights
restored); outsized updates taken back (`update_check.py`). A blamed batch's step is trained on a
clean batch of the steps just before it (`CleanBatches`, the caller's), so a skip loses no step.
Everything it decides is a function of the values it is given and a checkpoint's state, never of a
timing, so a resumed run decides alike. Numbers:
`benchmarks/README.md`, "The spike guard".
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any, Protocol

import torch

from .alarm import Alarm, DivergenceLevel
from .config import SpikeGuardConfig
from .copy_schedule import CopySchedule
from .guard_copies import CopyStore, Restorable, host_copies
from .spike_blame import DATA, MAX_SKIPS, WEIGHTS, Blame, detector_for
from .update_check import ExcursionCopy, UpdateCheck

logger = logging.getLogger(__name__)

__all__ = ["CleanBatches", "SpikeGuard", "SpikeGuardConfig"]


class CleanBatches(Protocol):
    """The caller's recent clean batches: the guard trains a blamed batch's step on one of them instead
    of skipping it (a skip loses the step; fault bench, shuffled labels: 0.04-0.44 of plain's damage on
    six tasks this way, 0.2-0.7 skipped)."""

    def keep(self, step: int) -> None:
        """`step` was applied and its batches were clean: keep them (the newest `MAX_SKIPS` steps')."""

    def train_on(self, back: int) -> int | None:
        """This step's gradients made again from the `back`-th newest kept step's batches, clipped as the
        loop clips; that step's number (None: fewer kept, the gradients untouched)."""


class SpikeGuard:
    """Judges every real step's loss before its update is applied. Per real step outside a predict phase
    the engine calls `alarms`, `before_update` and `update_alarms` around the optimizer's step, then
    `skipped`, `take_back`, `restore` or `observe`; `rebase` at a checkpoint. Every rank passes the same
    values, so all decide alike."""

    def __init__(
        self,
        optimizer: Any,
        config: SpikeGuardConfig | None = None,
        *,
        suspect_loss: Callable[[], float | None] | None = None,
        copies: tuple[CopyStore, CopyStore] | None = None,
        clean_batches: CleanBatches | None = None,
    ) -> None:
        """`config.enabled=False` (or no optimizer): a guard that judges and holds nothing. `suspect_loss()`:
        this step's batches' loss at the live weights, without a gradient (None: it cannot be). Without
        `clean_batches` a blamed batch's step is skipped."""
        self.config = config or SpikeGuardConfig()
        self.optimizer = optimizer
        groups = [] if optimizer is None or not self.config.enabled else optimizer.param_groups
        self.params = [p for group in groups for p in group["params"] if p.requires_grad]
        group_of = [i for i, group in enumerate(groups) for p in group["params"] if p.requires_grad]
        self.detector = detector_for(self.config)
        stores = copies or host_copies(self.config)
        self.copies = CopySchedule(self.params, optimizer, stores, self.config.every, self.config.trust_after)
        self.blame = Blame(self.config, self.detector, self.copies, self.params, suspect_loss)
        self.clean_batches = clean_batches
        self.update_check = UpdateCheck(
            self.params,
            max_ratio=self.config.max_update_ratio if self.config.storage == "host" else 0.0,
            history=self.config.history,
            min_history=self.config.min_history,
            suspect_loss=suspect_loss,
            device=self.config.device,
            groups=group_of,
        )
        self.restore_steps: list[int] = []
        self.skip_steps: list[int] = []
        self.taken_back_steps: list[int] = []
        self.scaled_back_steps: list[int] = []  # of those, the ones kept at the last kept update's rate
        self.replay_steps: list[int] = []
        self.skipped_steps = 0
        self.capped_at: int | None = None  # the step of the last refusal, logged once per window
        self.step_grad_norm: float | None = None

    @classmethod
    def off(cls) -> SpikeGuard:
        """A guard that judges nothing and holds nothing (what an engine without one has)."""
        return cls(None, SpikeGuardConfig(enabled=False))

    @property
    def trusted(self) -> CopyStore:
        return self.copies.trusted

    @property
    def pending(self) -> CopyStore:
        return self.copies.pending

    @property
    def suspect_since(self) -> int | None:
        """The first step a spike blamed the weights, not yet undone (None: no suspicion)."""
        return self.blame.suspect_since

    # ---- the engine's calls, in step order ----------------------------------------------------------

    def alarms(
        self, step: int, loss: float | None, grad_norm: float | None, can_skip: bool = True
    ) -> list[Alarm]:
        """The spike as the recovery rule takes it, before the update (`Blame.judge`). `can_skip=False`
        where the optimizer must see every step (a fp16 GradScaler)."""
        self.step_grad_norm = grad_norm  # a sign the update check reads before the update
        if not self.params or not _finite(loss, grad_norm):
            return []
        return self.blame.judge(step, loss, grad_norm, can_skip)

    def before_update(self, step: int) -> None:
        """The update check keeps what the optimizer is about to change (`UpdateCheck.take`)."""
        if not self.update_check.on:
            return
        lrs = [None if g.get("lr") is None else float(g["lr"]) for g in self.optimizer.param_groups]
        self.update_check.take(step, lrs, self.detector.grad_ratio(self.step_grad_norm))

    def update_alarms(self, step: int) -> list[Alarm]:
        """The update just applied, judged (`UpdateCheck`); past `MAX_SKIPS` skips in a row it stays."""
        why = self.update_check.judge(can_take_back=self.blame.skips_in_a_row < MAX_SKIPS)
        if why is None:
            return []
        why = f"outsized update: {why}"
        scaled = self.update_check.scales is not None
        return [
            Alarm(
                DivergenceLevel.CRITICAL,
                why,
                spike=True,
                skips_step=True,
                takes_back=True,
                scales_back=scaled,
            )
        ]

    def take_back(self, step: int) -> None:
        """Put back the weights of before an applied update the recovery rule skips (or its excursion), or
        keep it at the last kept update's rate where its rate jumped (`UpdateCheck.take_back`)."""
        steps, scaled = self.update_check.take_back()
        self.taken_back_steps += steps
        if scaled:
            self.scaled_back_steps += steps

    def skipped(self, step: int, replace: bool = False) -> int | None:
        """The recovery rule skipped this step's update. `replace` (the batch was blamed): the i-th skip in
        a row makes the step's gradients from the i-th newest clean step's batches, for the caller to
        apply; that step's number (None: nothing replaces the batch)."""
        self.blame.skips_in_a_row += 1
        self.skip_steps.append(step)
        if step not in self.scaled_back_steps:  # a step kept at the last kept rate used its batch
            self.skipped_steps += 1
        if not replace or self.clean_batches is None:
            return None
        source = self.clean_batches.train_on(self.blame.skips_in_a_row)
        if source is not None:
            self.replay_steps.append(step)
        return source

    def observe(self, step: int, loss: float | None, grad_norm: float | None) -> None:
        """An applied step joins the recent window; a clean one earns trust for the pending copy or takes
        one (never while the weights are suspect)."""
        if not self.params or not _finite(loss, grad_norm):
            return
        self.detector.add(loss, grad_norm, step)
        if self.clean_batches is not None and not self.blame.fired:
            self.clean_batches.keep(step)
        if self.blame.applied():
            self.copies.advance(step)

    def can_restore(self, step: int, why: str) -> bool:
        """A copy from before the fault is available, worth restoring (`Blame.worth_restoring`), and the
        window's cap is not reached (each refusal is said)."""
        copy = self._source(step)
        problem = copy.available()
        if problem is not None:
            logger.warning("hf_hybrid: step %d: %s; %s to restore, carried on", step, why, problem)
            self.blame.clear()
            return False
        if not self.blame.worth_restoring(step, copy):
            return False
        recent = [s for s in self.restore_steps if s > step - self.config.window]
        if len(recent) < self.config.max_restores:
            return True
        if self.capped_at is None or self.capped_at <= step - self.config.window:
            logger.warning(
                "hf_hybrid: step %d: %s, but %d restores in the last %d steps already: the spike guard "
                "stops restoring until the window has passed",
                step,
                why,
                len(recent),
                self.config.window,
            )
            self.capped_at = step
        self.blame.clear()
        return False

    def _source(self, step: int) -> Restorable:
        """What a restore at `step` goes back to: the newest copy from before the fault's onset, the update
        check's from before an open learning-rate excursion included when the fault was first seen inside
        it (a burst undone, fewer clean batches given back than by the schedule's older copy)."""
        onset = self.blame.onset(step)
        copy = self.copies.before(onset)
        excursion = self.update_check.before_excursion()
        if excursion is None or excursion.step + 1 >= onset:
            return copy
        return excursion if copy.step is None or excursion.step > copy.step else copy

    def restore(self, step: int, why: str) -> None:
        """Put back the copy from before the fault; the batches since it are skipped."""
        copy = self._source(step)
        copy.restore(self.params, self.optimizer)
        self.update_check.end_excursion()
        self.detector.forget_after(copy.step)
        since = max(copy.step, self.restore_steps[-1]) if self.restore_steps else copy.step
        skipped = step - since  # batches not yet counted as skipped by an earlier restore of this copy
        self.skipped_steps += skipped
        self.restore_steps.append(step)
        self.blame.restored()
        if isinstance(copy, ExcursionCopy):
            self.copies.rolled_back(copy.step)
            of, what = copy.step, "the weights (the update check's copy, from before the rate jumped)"
        else:
            of, what = self.copies.restored(copy, step), "the weights and optimizer state"
        logger.warning(
            "hf_hybrid: step %d: %s -> restored %s of step %d, skipping the %d batches since",
            step,
            why,
            what,
            of,
            skipped,
        )

    def rebase(self, step: int) -> None:
        """A checkpoint of this step was saved: the copies start again from it, so it need not hold them,
        and an open excursion ends (a resumed run has no copy of before it)."""
        if not self.params:
            return
        self.copies.rebase(step)
        self.update_check.end_excursion()

    # ---- what it holds and did --------------------------------------------------------------------

    def tensors(self) -> list[torch.Tensor]:
        """The copies' buffers and the update check's."""
        return [*self.copies.tensors(), *self.update_check.copy]

    def nbytes(self) -> int:
        return self.copies.nbytes() + self.update_check.nbytes()

    def buffer_count(self) -> int:
        """A number that changes when a buffer comes or goes (cheap to read every step)."""
        return self.nbytes()

    def stats(self) -> dict[str, Any]:
        """What it did and holds; a guard that is off reports the same keys, nothing done."""
        on = bool(self.params)
        return {
            "spike_guard": on,
            "spike_guard_storage": self.config.storage if on else None,
            "restores": len(self.restore_steps),
            "spike_skipped_steps": self.skipped_steps,
            "restore_steps": list(self.restore_steps),
            "skips": len(self.skip_steps),
            "skip_steps": list(self.skip_steps),
            "replays": len(self.replay_steps),
            "replay_steps": list(self.replay_steps),
            "spike_guard_bytes": self.nbytes(),
            "spike_guard_copy_every": self.copies.every if on else None,
            "blamed_data": self.blame.blames[DATA],
            "blamed_weights": self.blame.blames[WEIGHTS],
            "update_check": self.update_check.on,
            "updates_taken_back": len(self.taken_back_steps),
            "taken_back_steps": list(self.taken_back_steps),
            "scaled_back_steps": list(self.scaled_back_steps),
            "largest_update_ratio": self.update_check.largest_ratio,
            "update_check_copies": self.update_check.copies,
            "unjudged_updates": self.update_check.unjudged,
        }

    def state_dict(self) -> dict[str, Any]:
        """Everything but the copies: saving first `rebase`s them on the saved state itself."""
        return {
            "detector": self.detector.state_dict(),
            **self.copies.state_dict(),
            **self.blame.state_dict(),
            "restore_steps": list(self.restore_steps),
            "skip_steps": list(self.skip_steps),
            "replay_steps": list(self.replay_steps),
            "skipped_steps": self.skipped_steps,
            "update_check": self.update_check.state_dict(),
            "taken_back_steps": list(self.taken_back_steps),
            "scaled_back_steps": list(self.scaled_back_steps),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A resumed run: the checkpoint's own weights and optimizer state are the pending copy."""
        self.detector.load_state_dict(state["detector"])
        self.restore_steps = [int(s) for s in state["restore_steps"]]
        self.skip_steps = [int(s) for s in state.get("skip_steps", [])]
        self.replay_steps = [int(s) for s in state.get("replay_steps", [])]
        self.skipped_steps = int(state["skipped_steps"])
        self.blame.load_state_dict(state)
        if "update_check" in state:  # saved before the check existed: it starts afresh
            self.update_check.load_state_dict(state["update_check"])
        self.taken_back_steps = [int(s) for s in state.get("taken_back_steps", [])]
        self.scaled_back_steps = [int(s) for s in state.get("scaled_back_steps", [])]
        self.copies.load_state_dict(state)


def _finite(loss: float | None, grad_norm: float | None) -> bool:
    values = [v for v in (loss, grad_norm) if v is not None]
    return bool(values) and all(math.isfinite(v) for v in values)
