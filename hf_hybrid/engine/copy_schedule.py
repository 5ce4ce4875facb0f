"""When the spike guard copies the training state, which copy it trusts, and which one a restore goes
back to.

A copy is *pending* until `trust_after` clean steps follow it, then *trusted* (a spike is often seen a
step after its cause). A restore goes back to the newest copy taken `ONSET_MARGIN` steps before the
fault's onset, the pending one included (less clean progress given back). Every decision is a function
of step numbers and checkpointed state; saving `rebase`s the copies on the saved state, so a resumed run
holds the copies the uninterrupted one holds.
"""

from __future__ import annotations

from typing import Any

import torch

from .guard_copies import CopyStore
from .spike_detector import SHIFT_STEPS

ONSET_MARGIN = SHIFT_STEPS + 1  # a copy this many steps before the first firing step predates the fault


class CopySchedule:
    """The trusted copy and the next one (pending, or a store free for the next copy)."""

    def __init__(
        self,
        params: list[torch.Tensor],
        optimizer: Any,
        copies: tuple[CopyStore, CopyStore],
        every: int,
        trust_after: int,
    ) -> None:
        self.params = params
        self.optimizer = optimizer
        self.trusted, self.pending = copies
        self.every = every
        self.trust_after = trust_after
        self.clean_since_pending = 0

    def advance(self, step: int) -> None:
        """A clean applied step (never while suspect): a pending copy earns trust; a copy may be due."""
        if self.pending.step is not None:
            self.clean_since_pending += 1
            if self.clean_since_pending >= self.trust_after:
                self.trusted, self.pending = self.pending, self.trusted
                self.pending.step = None
        if self.pending.periodic and step % self.every == 0 and self.pending.step is None:
            self._take(step)

    def before(self, onset: int) -> CopyStore:
        """The pending copy if taken `ONSET_MARGIN` steps before `onset` and restorable, else the trusted."""
        pending = self.pending
        if pending.step is not None and pending.step <= onset - ONSET_MARGIN and pending.available() is None:
            return pending
        return self.trusted

    def restored(self, store: CopyStore, step: int) -> int:
        """`store` was put back at `step`: it is the trusted copy now, none pending; returns its old step."""
        of = store.step
        if store is self.pending:
            self.trusted, self.pending = self.pending, self.trusted
        self.pending.step = None  # its buffers stay, for the next copy
        self.clean_since_pending = 0
        if not store.persistent:
            store.step = step
        return of

    def rolled_back(self, step: int) -> None:
        """The weights went back to those after `step` from a copy not of this schedule (the update check's):
        a pending copy taken since holds what was undone and is dropped."""
        if self.pending.step is not None and self.pending.step > step:
            self.pending.step = None
            self.clean_since_pending = 0

    def rebase(self, step: int) -> None:
        """A checkpoint of this step was saved: the copies start again from it, as a resumed run's do."""
        if not self.trusted.persistent:  # dropped, as a resumed run never had it
            self.trusted.step = None
        self._take(step)

    def _take(self, step: int) -> None:
        """A pending copy of this step; the other store reserves its buffers (the guard budgets two)."""
        self.pending.take(step, self.params, self.optimizer)
        self.clean_since_pending = 0
        other = self.trusted
        if other.periodic and other.step is None and other.nbytes() == 0:
            other.reserve(self.params, self.optimizer)

    def state_dict(self) -> dict[str, Any]:
        """The copies' steps (not their tensors: a resumed run copies the state it loaded again)."""
        if self.trusted.step is not None and not self.trusted.persistent:
            raise RuntimeError("CopySchedule.state_dict() without rebase(): the trusted copy would be lost")
        return {
            "trusted_step": self.trusted.step,  # a checkpoint on disk (None for copies in memory)
            "pending_step": self.pending.step,
            "clean_since_pending": self.clean_since_pending,
            "copy_every": self.every,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A resumed run: the state loaded by now is the pending copy's; the spacing is the saved one."""
        self.every = int(state.get("copy_every") or self.every)
        self.trusted.clear()
        self.pending.clear()
        pending, trusted = state.get("pending_step"), state.get("trusted_step")
        if self.params and trusted is not None and self.trusted.persistent:
            self.trusted.take(int(trusted), self.params, self.optimizer)
        if self.params and pending is not None:
            self._take(int(pending))
        self.clean_since_pending = int(state.get("clean_since_pending", 0))

    def tensors(self) -> list[torch.Tensor]:
        return [*self.trusted.tensors(), *self.pending.tensors()]

    def nbytes(self) -> int:
        return self.trusted.nbytes() + self.pending.nbytes()
