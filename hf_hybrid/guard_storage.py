"""Where the spike guard's copies live, decided once at the start of training from measured sizes.

Two copies of what a restore puts back: `host` (weights and optimizer state), `weights` (a restore
resets the moments), `checkpoint` (the Trainer's last checkpoint, from disk) or `none` (skips only);
`host` adds the update check's copy of the weights where it fits. `auto` takes the first that fits the
budget (default: a fifth of the available host memory; `benchmarks/README.md`, "The spike guard").
Spacing comes from the copy's bytes (`copy_spacing`), not a timing, so a resumed run copies alike.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

AUTO_BUDGET_SHARE = 0.2  # of the host memory available at the start of training
MIB = 2**20
MAX_SPACING = 16  # the copies' spacing grows to at most this many times `every`


def available_host_bytes() -> int | None:
    """Host memory available now (Linux and other POSIX systems), None where it cannot be read."""
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def optimizer_state_bytes(optimizer: Any, params: Iterable[torch.Tensor]) -> int:
    """The optimizer state's bytes for `params`: counted, else estimated from the optimizer's kind (torch's
    Adam creates its state lazily): 8-bit two bytes per element, Adam-like two weights, others one."""
    params = list(params)
    counted = sum(
        v.numel() * v.element_size()
        for p in params
        for v in (optimizer.state.get(p) or {}).values()
        if torch.is_tensor(v)
    )
    if counted:
        return counted
    name = type(getattr(optimizer, "optimizer", optimizer)).__name__.lower()
    elements = sum(p.numel() for p in params)
    weights = sum(p.numel() * p.element_size() for p in params)
    if "8bit" in name:
        return 2 * elements
    return 2 * weights if any(k in name for k in ("adam", "lamb", "ademamix")) else weights


@dataclass(frozen=True)
class StoragePlan:
    """The storage chosen, its copies' bytes (the update check's included), the budget, and why."""

    storage: str
    copy_bytes: int
    budget: int | None
    reason: str
    update_check: bool = False
    copy_every: int | None = None  # steps between two copies (None: no periodic copy)
    one_copy_bytes: int = 0

    def line(self) -> str:
        """What the start of training says about it: where the copies live, how far apart, the memory."""
        held = f"{self.copy_bytes / MIB:.1f} MiB of host memory"
        budget = "no budget" if self.budget is None else f"budget {self.budget / MIB:.0f} MiB"
        spaced = (
            f"; one copy ({self.one_copy_bytes / MIB:.1f} MiB) every {self.copy_every} steps"
            if self.copy_every is not None
            else ""
        )
        return (
            f"hf_hybrid: spike guard on, copies in {self.storage}{spaced}: {held} ({budget}); {self.reason}"
        )


def copy_spacing(copy_bytes: int, every: int, spacing_mb: float) -> int:
    """Steps between two copies of `copy_bytes`: `every` up to `spacing_mb` MiB, x2 per doubling beyond,
    x`MAX_SPACING` at most (`spacing_mb` 0: `every` whatever the size)."""
    spacing = every
    limit = spacing_mb * MIB
    while limit > 0 and copy_bytes > limit * spacing / every and spacing < MAX_SPACING * every:
        spacing *= 2
    return spacing


def choose_storage(
    requested: str,
    weights_bytes: int,
    state_bytes: int,
    budget: int | None,
    saves_checkpoints: bool,
    update_check: bool = False,
    every: int = 10,
    spacing_mb: float = 0.0,
) -> StoragePlan:
    """`requested` resolved against the budget: a storage it cannot hold falls back to the next, the
    reason says which and why. `update_check`: one more copy of the weights with `host`, where it fits."""
    sizes = {
        "host": 2 * (weights_bytes + state_bytes),
        "weights": 2 * weights_bytes,
        "checkpoint": 0,
        "none": 0,
    }
    order = ["host", "weights", "checkpoint", "none"]
    if requested != "auto":
        order = order[order.index(requested) :]
    notes: list[str] = []
    for storage in order:
        size = sizes[storage]
        if storage == "checkpoint" and not saves_checkpoints:
            notes.append("no checkpoint is saved (save_strategy='no') to restore from")
            continue
        if budget is not None and size > budget:
            notes.append(f"{storage} copies ({size / MIB:.1f} MiB) exceed the budget")
            continue
        chosen = "as asked" if storage == requested else f"{requested} -> {storage}"
        reason = chosen + (": " + "; ".join(notes) if notes else "")
        if storage == "none":
            reason += "; bad batches are skipped, nothing can be restored"
        check = update_check and storage == "host"
        if check:
            extra = weights_bytes
            check = budget is None or size + extra <= budget
            reason += (
                f"; with the update check's copy ({extra / MIB:.1f} MiB, filled before a step whose lr jumps)"
                if check
                else f"; no update check: its copy ({extra / MIB:.1f} MiB) exceeds the budget"
            )
            size += extra if check else 0
        one = sizes[storage] // 2
        spacing = copy_spacing(one, every, spacing_mb) if storage in ("host", "weights") else None
        return StoragePlan(storage, size, budget, reason, check, spacing, one)
    raise AssertionError("`none` always fits")


def memory_budget(megabytes: float | None) -> int | None:
    """The budget in bytes: `hybrid_guard_memory_mb`, or a share of the available host memory."""
    if megabytes is not None:
        return int(megabytes * MIB)
    available = available_host_bytes()
    return None if available is None else int(AUTO_BUDGET_SHARE * available)
