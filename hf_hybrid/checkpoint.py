"""The hybrid state inside an HF checkpoint folder.

Readable part: a JSON tree stored by `HybridStateCallback` in `trainer_state.json`
(`stateful_callbacks`). Tensor part: `hybrid_state.safetensors` in the same folder, written to a
temporary name and renamed, with its SHA-256 in the JSON so a truncated or altered file is refused
instead of restoring garbage.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from safetensors.torch import load_file, save_file
from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from .engine.state import FORMAT_VERSION, join_state, split_state

HYBRID_STATE_FILE = "hybrid_state.safetensors"
HYBRID_TIMELINE_FILE = "hybrid_timeline.json"


class HybridCheckpointError(ValueError):
    """A saved hybrid state cannot be restored; the message says why and what to do."""


class HybridStateCallback(TrainerCallback, ExportableState):
    """Carries the engine's readable state into `trainer_state.json` (the trainer fills `engine_state`)."""

    def __init__(self) -> None:
        self.engine_state: dict[str, Any] | None = None

    def state(self) -> dict[str, Any]:
        return {"args": {}, "attributes": {"engine_state": self.engine_state}}


def save_engine_state(state: dict[str, Any], folder: str | os.PathLike, write_files: bool) -> dict[str, Any]:
    """Write the tensors (when `write_files`, i.e. on the saving rank); return the JSON entry."""
    tree, tensors = split_state(state)
    path = Path(folder) / HYBRID_STATE_FILE
    contiguous = {name: t.detach().cpu().contiguous() for name, t in tensors.items()}
    if write_files:
        tmp = path.with_suffix(".tmp")
        save_file(contiguous, str(tmp), metadata={"format": "pt", "hf_hybrid_format": str(FORMAT_VERSION)})
        digest = _sha256(tmp)
        os.replace(tmp, path)
    else:
        digest = None
    return {
        "format_version": FORMAT_VERSION,
        "tensor_file": HYBRID_STATE_FILE,
        "sha256": digest,
        "state": tree,
    }


def load_engine_state(entry: dict[str, Any], folder: str | os.PathLike) -> dict[str, Any]:
    """Rebuild the engine state from the JSON entry and the tensor file, or raise HybridCheckpointError."""
    hint = "set `hybrid_restart_engine=True` to resume with a fresh engine instead"
    version = entry.get("format_version")
    if version != FORMAT_VERSION:
        raise HybridCheckpointError(
            f"{folder}: hybrid state format {version!r} is not supported (this hf_hybrid reads "
            f"{FORMAT_VERSION}); upgrade hf_hybrid or {hint}"
        )
    path = Path(folder) / entry.get("tensor_file", HYBRID_STATE_FILE)
    if not path.is_file():
        raise HybridCheckpointError(f"{path} is missing but trainer_state.json has a hybrid state; {hint}")
    expected = entry.get("sha256")
    if expected is not None and _sha256(path) != expected:
        raise HybridCheckpointError(f"{path} is corrupt or truncated (checksum mismatch); {hint}")
    try:
        tensors = load_file(str(path))
    except Exception as exc:  # safetensors raises several types for damaged files
        raise HybridCheckpointError(f"{path} cannot be read ({exc}); {hint}") from exc
    try:
        return join_state(entry["state"], tensors)
    except (KeyError, TypeError) as exc:
        raise HybridCheckpointError(
            f"{folder}: the hybrid state in trainer_state.json is damaged ({exc}); {hint}"
        ) from exc


def save_timeline(timeline: list[dict[str, Any]], folder: str | os.PathLike) -> None:
    path = Path(folder) / HYBRID_TIMELINE_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(timeline))
    os.replace(tmp, path)


def load_timeline(folder: str | os.PathLike) -> list[dict[str, Any]]:
    path = Path(folder) / HYBRID_TIMELINE_FILE
    return json.loads(path.read_text()) if path.is_file() else []


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
