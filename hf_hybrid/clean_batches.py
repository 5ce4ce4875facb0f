"""The micro-batches of the newest clean steps, which the spike guard trains on in a blamed batch's place.

A skipped step loses its progress; the fault bench's controls showed that training the step on a recent
clean batch instead keeps most of it (`benchmarks/README.md`, "The spike guard"). The batches are the
loop's own, kept by reference for `MAX_SKIPS` steps (a skip in a row past that is not made), and written
into each checkpoint, one file per rank, so a resumed run trains on the same ones. There the integer
inputs are stored in the narrowest integer type that holds their values, and an input equal to another
(a causal LM's labels and input ids) once: token ids as int64, 8 steps of them, had made a small
model's checkpoint 22-45% larger than the plain `Trainer`'s.
"""

from __future__ import annotations

import logging
import os
import pickle
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .engine.spike_blame import MAX_SKIPS

logger = logging.getLogger(__name__)

Batch = tuple[dict[str, Any], Any]  # one micro-batch's inputs and its `num_items_in_batch`
NARROW = (torch.uint8, torch.int16, torch.int32)  # the integer types a saved input may shrink to


def file_name(rank: int) -> str:
    return f"hybrid_clean_batches_rank{rank}.pt"


class RecentCleanBatches:
    """The spike guard's `CleanBatches`: `current()` gives the step's micro-batches, `train(batches)` makes
    the step's gradients from others (the trainer's, which knows the loop)."""

    def __init__(
        self,
        current: Callable[[], list[Batch]],
        train: Callable[[list[Batch]], None],
        capacity: int = MAX_SKIPS,
    ) -> None:
        self.current = current
        self.train = train
        self.kept: deque[tuple[int, list[Batch]]] = deque(maxlen=capacity)

    def keep(self, step: int) -> None:
        self.kept.append((step, self.current()))

    def train_on(self, back: int) -> int | None:
        if not 1 <= back <= len(self.kept):
            return None
        step, batches = self.kept[-back]
        self.train(batches)
        return step

    def save(self, folder: str | Path, rank: int) -> None:
        """This rank's kept batches into the checkpoint folder (plain dicts: loadable with weights only)."""
        kept = [
            {"step": step, "batches": [{**_packed(inputs), "num_items": n} for inputs, n in batches]}
            for step, batches in self.kept
        ]
        path = Path(folder) / file_name(rank)
        path.parent.mkdir(parents=True, exist_ok=True)  # another rank may not have made the folder yet
        partial = path.with_name(path.name + ".tmp")
        try:
            torch.save(kept, partial)
            os.replace(partial, path)  # a run killed while saving leaves no half-written file
        except (AttributeError, TypeError, pickle.PicklingError) as error:  # an object pickle cannot take
            partial.unlink(missing_ok=True)
            logger.warning(
                "hf_hybrid: the spike guard's kept batches are not in %s (%s): a run resumed from it keeps "
                "clean batches from its first step",
                folder,
                error,
            )

    def load(self, folder: str | Path, rank: int, device: torch.device | str) -> None:
        """The kept batches of a checkpoint; one saved before they were kept starts with none (said)."""
        path = Path(folder) / file_name(rank)
        self.kept.clear()
        if not path.is_file():
            logger.info(
                "hf_hybrid: %s has no %s: the spike guard keeps clean batches from the first resumed step",
                folder,
                path.name,
            )
            return
        device = torch.device(device)
        where = "cpu" if device.type == "cpu" else device  # "cpu:0" names no location torch restores to
        try:
            saved = torch.load(path, map_location=where, weights_only=True)
        except (RuntimeError, pickle.UnpicklingError) as error:  # inputs holding more than tensors and lists
            logger.warning(
                "hf_hybrid: %s cannot be read back (%s): the spike guard keeps clean batches from the first "
                "resumed step, so a blamed batch right after this resume is skipped where the uninterrupted "
                "run would have trained its step on a kept one",
                path,
                str(error).splitlines()[0],
            )
            return
        for entry in saved:
            batches = [(_unpacked(batch), batch["num_items"]) for batch in entry["batches"]]
            self.kept.append((int(entry["step"]), batches))


def _packed(inputs: dict[str, Any]) -> dict[str, Any]:
    """The inputs as saved: each integer tensor in the narrowest type holding its values (`dtypes` says
    the type it had), and a tensor equal to an earlier one stored as that one (pickle saves it once)."""
    packed: dict[str, Any] = {}
    dtypes: dict[str, str] = {}
    for name, value in inputs.items():
        if isinstance(value, torch.Tensor) and not value.is_floating_point() and not value.is_complex():
            dtypes[name] = str(value.dtype).removeprefix("torch.")
            value = _narrowed(value)
            value = next((v for v in packed.values() if _same(v, value)), value)
        packed[name] = value
    return {"inputs": packed, "dtypes": dtypes}


def _unpacked(batch: dict[str, Any]) -> dict[str, Any]:
    """The inputs as the loop gave them (each tensor its own, in its own type)."""
    dtypes = batch.get("dtypes", {})
    return {
        name: value.to(getattr(torch, dtypes[name]), copy=True) if name in dtypes else value
        for name, value in batch["inputs"].items()
    }


def _narrowed(value: torch.Tensor) -> torch.Tensor:
    if value.numel() == 0 or value.dtype == torch.bool:
        return value
    low, high = int(value.min()), int(value.max())
    for dtype in NARROW:
        info = torch.iinfo(dtype)
        if info.min <= low and high <= info.max and info.bits < torch.iinfo(value.dtype).bits:
            return value.to(dtype)
    return value


def _same(a: Any, b: torch.Tensor) -> bool:
    return isinstance(a, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
