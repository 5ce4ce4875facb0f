"""The spike guard: a loss spike in a real step is blamed on the batch or on the weights before anything
is done about it, and only what is to blame is undone.

What large runs do by hand when the loss spikes (skip the batches that caused it, or go back to a state
before it), done on the fly and through the engine's one recovery rule (`recovery.py`):

- copies of the trainable weights and the optimizer state are taken every `every` clean steps and
  trusted once clean steps follow them (`copy_schedule.py`, stored as `guard_copies.py` says);
- the engine's spike detector (`spike_detector.py`) says whether a step's loss (or gradient norm) is a
  sudden spike or part of a lasting shift against the recent clean steps;
- when it fires, the guard *blames* before acting (`spike_blame.py`): bad data is skipped
  (`RecoveryAction.SKIP`, the weights kept), damaged weights that do not come back by themselves are
  restored (`RecoveryAction.RESTORE`: the copy put back, the batches since skipped);
- where its copy fits, every step's applied update is checked too (`update_check.py`): an outsized one
  that did harm is taken back (`RecoveryAction.SKIP` after the fact).

Everything it decides is a function of the losses, gradient norms, learning rates and step numbers it is
given and of the state a checkpoint carries, never of a timing: a resumed run decides what the
uninterrupted run decides, at any machine load. At most `max_restores` restores in any `window` steps:
after that it says so and lets the run train as the plain loop would. Non-finite steps are not spikes
here: the recovery rule never applies them. Numbers and how they were chosen: `benchmarks/README.md`,
"The spike guard".
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import torch

from .alarm import Alarm, DivergenceLevel
from .config import SpikeGuardConfig
from .copy_schedule import CopySchedule
from .guard_copies import CopyStore, host_copies
from .spike_blame import DATA, MAX_SKIPS, WEIGHTS, Blame, detector_for
from .update_check import UpdateCheck

logger = logging.getLogger(__name__)

__all__ = ["SpikeGuard", "SpikeGuardConfig"]


class SpikeGuard:
    """Judges every real step's loss before its update is applied; skips the bad batches, restores a
    copy when the weights are to blame and do not come back by themselves, takes back outsized updates.

    The engine calls, per real step outside a predict phase: `alarms` (before the update; what the
    recovery rule acts on), `before_update` and `update_alarms` around the optimizer's step, then
    `skipped`, `take_back`, `restore` or `observe` as the rule decided, and `rebase` when the caller
    saves a checkpoint. Every rank must pass the same loss and grad norm (the averaged ones), and
    `suspect_loss` must be the same on every rank, so all decide alike.
    """

    def __init__(
        self,
        optimizer: Any,
        config: SpikeGuardConfig | None = None,
        *,
        suspect_loss: Callable[[], float | None] | None = None,
        copies: tuple[CopyStore, CopyStore] | None = None,
    ) -> None:
        """`config.enabled=False` (or no optimizer): a guard that judges nothing and holds nothing, so its
        owner need not ask whether there is one. `suspect_loss()`: the loss of this step's batches at
        the live weights, measured again without a gradient (None: it cannot be); the guard calls it with
        a copy's weights swapped in, to blame. `copies`: the two stores the guard alternates between
        (default: host copies per `config.storage`)."""
        self.config = config or SpikeGuardConfig()
        self.optimizer = optimizer
        groups = [] if optimizer is None or not self.config.enabled else optimizer.param_groups
        self.params = [p for group in groups for p in group["params"] if p.requires_grad]
        self.detector = detector_for(self.config)
        stores = copies or host_copies(self.config)
        self.copies = CopySchedule(self.params, optimizer, stores, self.config.every, self.config.trust_after)
        self.blame = Blame(self.config, self.detector, self.copies, self.params, suspect_loss)
        self.update_check = UpdateCheck(
            self.params,
            max_ratio=self.config.max_update_ratio if self.config.storage == "host" else 0.0,
            history=self.config.history,
            min_history=self.config.min_history,
            suspect_loss=suspect_loss,
            device=self.config.device,
        )
        self.restore_steps: list[int] = []
        self.skip_steps: list[int] = []
        self.taken_back_steps: list[int] = []
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
        """The spike as the recovery rule takes it, judged before the step's update is applied
        (`Blame.judge`). `can_skip=False` where the optimizer must see every step (a fp16 GradScaler):
        a spike can only be restored there."""
        self.step_grad_norm = grad_norm  # a sign the update check reads before the update
        if not self.params or not _finite(loss, grad_norm):
            return []
        return self.blame.judge(step, loss, grad_norm, can_skip)

    def before_update(self, step: int) -> None:
        """The optimizer is about to apply this step's update: the update check keeps what it changes (the
        whole weights where this step's learning rates or gradient norm show a sign of an outsized one).
        The gradient norm's sign is its ratio to the detector's window of the applied steps' norms."""
        if not self.update_check.on:
            return
        lrs = [None if g.get("lr") is None else float(g["lr"]) for g in self.optimizer.param_groups]
        self.update_check.take(step, lrs, self.detector.grad_ratio(self.step_grad_norm))

    def update_alarms(self, step: int) -> list[Alarm]:
        """The update the optimizer just applied, judged (`UpdateCheck`): an alarm that takes it back, or
        none. Past `MAX_SKIPS` skips in a row it stays, as a spike does."""
        why = self.update_check.judge(can_take_back=self.blame.skips_in_a_row < MAX_SKIPS)
        if why is None:
            return []
        why = f"outsized update: {why}"
        return [Alarm(DivergenceLevel.CRITICAL, why, spike=True, skips_step=True, takes_back=True)]

    def take_back(self, step: int) -> None:
        """The recovery rule skips the step whose update was already applied: put back the weights of
        before it, or of before the learning-rate excursion it closed (the optimizer keeps what it learnt
        from the steps' gradients)."""
        self.taken_back_steps += self.update_check.take_back()

    def skipped(self, step: int) -> None:
        """The recovery rule skipped this step's update (the batch was blamed)."""
        self.blame.skips_in_a_row += 1
        self.skip_steps.append(step)
        self.skipped_steps += 1

    def observe(self, step: int, loss: float | None, grad_norm: float | None) -> None:
        """An applied step: its values join the recent window (a spike left alone is the new normal,
        learnt as such); a clean step earns trust for the pending copy or takes one (never while the
        weights are suspect: a copy of damaged weights must not become trusted)."""
        if not self.params or not _finite(loss, grad_norm):
            return
        self.detector.add(loss, grad_norm, step)
        if self.blame.applied():
            self.copies.advance(step)

    def can_restore(self, step: int, why: str) -> bool:
        """A copy from before the fault can be put back, it is still better than the weights now on this
        step's batch (`Blame.worth_restoring`: what the restore gives up against what the fault costs),
        and the window's cap is not reached (each refusal is said)."""
        copy = self.copies.before(self.blame.onset(step))
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

    def restore(self, step: int, why: str) -> None:
        """Put back the copy from before the fault (weights and optimizer state); the batches since it are
        skipped."""
        copy = self.copies.before(self.blame.onset(step))
        copy.restore(self.params, self.optimizer)
        self.update_check.end_excursion()
        self.detector.forget_after(copy.step)
        since = max(copy.step, self.restore_steps[-1]) if self.restore_steps else copy.step
        skipped = step - since  # batches not yet counted as skipped by an earlier restore of this copy
        self.skipped_steps += skipped
        self.restore_steps.append(step)
        self.blame.restored()
        of = self.copies.restored(copy, step)
        logger.warning(
            "hf_hybrid: step %d: %s -> restored the weights and optimizer state of step %d, skipping the "
            "%d batches since",
            step,
            why,
            of,
            skipped,
        )

    def rebase(self, step: int) -> None:
        """The caller saved a checkpoint of this step: the copies start again from it (`CopySchedule`), so
        the checkpoint need not hold them and the resumed run still decides what this one does; an open
        learning-rate excursion ends, as the resumed run has no copy of before it."""
        if not self.params:
            return
        self.copies.rebase(step)
        self.update_check.end_excursion()

    # ---- what it holds and did --------------------------------------------------------------------

    def tensors(self) -> list[torch.Tensor]:
        """The copies' buffers (both kept: the trusted one and the next, pending or reused) and the update
        check's."""
        return [*self.copies.tensors(), *self.update_check.copy]

    def nbytes(self) -> int:
        return self.copies.nbytes() + self.update_check.nbytes()

    def buffer_count(self) -> int:
        """What the copies hold, as a number that changes when a buffer comes or goes (their bytes: counted
        when they change, cheap to read every step)."""
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
            "spike_guard_bytes": self.nbytes(),
            "spike_guard_copy_every": self.copies.every if on else None,
            "blamed_data": self.blame.blames[DATA],
            "blamed_weights": self.blame.blames[WEIGHTS],
            "update_check": self.update_check.on,
            "updates_taken_back": len(self.taken_back_steps),
            "taken_back_steps": list(self.taken_back_steps),
            "largest_update_ratio": self.update_check.largest_ratio,
            "update_check_copies": self.update_check.copies,
            "unjudged_updates": self.update_check.unjudged,
        }

    def state_dict(self) -> dict[str, Any]:
        """Counters, the detector's window, the suspicion and the copies' steps; not the copies: saving the
        engine first `rebase`s them on the saved state itself, which a resumed run copies again."""
        return {
            "detector": self.detector.state_dict(),
            **self.copies.state_dict(),
            **self.blame.state_dict(),
            "restore_steps": list(self.restore_steps),
            "skip_steps": list(self.skip_steps),
            "skipped_steps": self.skipped_steps,
            "update_check": self.update_check.state_dict(),
            "taken_back_steps": list(self.taken_back_steps),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A resumed run: the state as saved at a checkpoint, whose own weights and optimizer state (loaded
        by then) are the pending copy, taken again here."""
        self.detector.load_state_dict(state["detector"])
        self.restore_steps = [int(s) for s in state["restore_steps"]]
        self.skip_steps = [int(s) for s in state.get("skip_steps", [])]
        self.skipped_steps = int(state["skipped_steps"])
        self.blame.load_state_dict(state)
        if "update_check" in state:  # saved before the check existed: it starts afresh
            self.update_check.load_state_dict(state["update_check"])
        self.taken_back_steps = [int(s) for s in state.get("taken_back_steps", [])]
        self.copies.load_state_dict(state)


def _finite(loss: float | None, grad_norm: float | None) -> bool:
    values = [v for v in (loss, grad_norm) if v is not None]
    return bool(values) and all(math.isfinite(v) for v in values)
