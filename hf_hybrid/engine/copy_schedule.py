"""When the spike guard copies the training state, which copy it trusts, and which one a restore goes
back to.

Every `every` clean applied steps a copy of the trainable weights and the optimizer state is taken (into
the store not holding the trusted copy). A copy is *pending* until `trust_after` clean steps have followed
it, then *trusted*: a spike is often seen a step or more after the update that caused it, so only a copy
with clean steps after it is a state to go back to. A restore for a fault whose first firing step is known
(its *onset*) goes back to the newest copy taken well before that onset (`ONSET_MARGIN` steps: a lasting
shift is seen up to `SHIFT_STEPS` steps after its first raised loss), the pending one included, rather
than to the last trusted one: a restore gives back less clean progress.

Every decision here is a function of the step numbers and of the state a checkpoint carries: the spacing
(`every`, decided from the copy's bytes before training, `guard_storage.copy_spacing`), the copies' steps
and the count of clean steps since the pending one. Saving the engine `rebase`s the copies on the saved
state itself, which a resumed run copies again, so a resumed run holds the copies the uninterrupted run
holds at every step.
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
        """A clean applied step (never while the weights are suspect: a copy of damaged weights must not
        become trusted): a pending copy earns trust; a copy is due every `every` steps."""
        if self.pending.step is not None:
            self.clean_since_pending += 1
            if self.clean_since_pending >= self.trust_after:
                self.trusted, self.pending = self.pending, self.trusted
                self.pending.step = None
        if self.pending.periodic and step % self.every == 0 and self.pending.step is None:
            self._take(step)

    def before(self, onset: int) -> CopyStore:
        """The copy a restore for a fault first seen at `onset` goes back to: the pending copy when it was
        taken `ONSET_MARGIN` steps or more before the onset (and can be restored), else the trusted one."""
        pending = self.pending
        if pending.step is not None and pending.step <= onset - ONSET_MARGIN and pending.available() is None:
            return pending
        return self.trusted

    def restored(self, store: CopyStore, step: int) -> int:
        """`store` was put back at `step`: it is the trusted copy from now on (a copy in memory now holds
        this step's state; a checkpoint keeps its folder's step), and no copy is pending. Returns the
        step the restored state is of."""
        of = store.step
        if store is self.pending:
            self.trusted, self.pending = self.pending, self.trusted
        self.pending.step = None  # its buffers stay, for the next copy
        self.clean_since_pending = 0
        if not store.persistent:
            store.step = step
        return of

    def rebase(self, step: int) -> None:
        """The caller saved a checkpoint of this step: the copies start again from it (a pending copy of
        this very state, no trusted one in memory; a trusted checkpoint on disk stays), exactly as a run
        resumed from that checkpoint starts them."""
        if not self.trusted.persistent:  # dropped, as a resumed run never had it
            self.trusted.step = None
        self._take(step)

    def _take(self, step: int) -> None:
        """A pending copy of this step; the other store holds the buffers of one from the first copy on
        (two copies are what the guard budgets), so the memory a run holds is the same whether it went on
        from a save or was resumed from it."""
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
        """A resumed run: the weights and optimizer state loaded by now are the pending copy's, taken
        again here; the spacing is the saved one (the run that saved it decided it)."""
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
