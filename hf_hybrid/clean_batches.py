"""The micro-batches of the newest clean steps, which the spike guard trains on in a blamed batch's place.

A skipped step loses its progress; the fault bench's controls showed that training the step on a recent
clean batch instead keeps most of it (`benchmarks/README.md`, "The spike guard"). The batches are the
loop's own, kept by reference for `MAX_SKIPS` steps (a skip in a row past that is not made), and written
into each checkpoint, one file per rank, so a resumed run trains on the same ones.
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
            {"step": step, "batches": [{"inputs": dict(inputs), "num_items": n} for inputs, n in batches]}
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
            batches = [(batch["inputs"], batch["num_items"]) for batch in entry["batches"]]
            self.kept.append((int(entry["step"]), batches))
