"""The hybrid state inside an HF checkpoint folder.

Each piece written to a temporary name and renamed: `hybrid_state.safetensors` (the tensors),
`hybrid_state.json.gz` (the readable rest as gzip-compressed JSON, `"@tensor:<name>"` where a tensor
went; compressed because its floats and the timeline's rows would otherwise outweigh a small adapter's
checkpoint), and a small entry in
`trainer_state.json` with the format version, file names and SHA-256, so a damaged file is refused.
Under FSDP2 every rank writes its own pair (`hybrid_state_rank{R}.*`, listed under `ranks`); another
world size is refused (shards cannot be re-split).
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import logging
import os
import re
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist
from safetensors.torch import load_file, save_file
from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from .engine.state import (
    FORMAT_VERSION,
    describe_mismatch,
    describe_sharding_mismatch,
    join_state,
    split_state,
)

logger = logging.getLogger(__name__)

HYBRID_STATE_FILE = "hybrid_state.safetensors"
HYBRID_STATE_JSON = "hybrid_state.json.gz"
_SUMMARY_KEYS = ("steps", "backward_skipped", "predict_phases", "rollbacks", "predictor")
TRAINER_STATE_FILE = "trainer_state.json"  # written last by Trainer._save_checkpoint
_CHECKPOINT_DIR = re.compile(r"^checkpoint-(\d+)$")
HYBRID_TIMELINE_FILE = "hybrid_timeline.json.gz"
_OLD_TIMELINE_FILE = "hybrid_timeline.json"  # the uncompressed name of older saves, still read


class HybridCheckpointError(ValueError):
    """A saved hybrid state cannot be restored; the message says why and what to do."""


class HybridStateCallback(TrainerCallback, ExportableState):
    """Carries the engine's readable state into `trainer_state.json` (the trainer fills `engine_state`)."""

    def __init__(self) -> None:
        self.engine_state: dict[str, Any] | None = None

    def state(self) -> dict[str, Any]:
        return {"args": {}, "attributes": {"engine_state": self.engine_state}}


def save_engine_state(
    state: dict[str, Any], folder: str | os.PathLike, write_files: bool, summary: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Write the state files (when `write_files`: the saving rank); return the `trainer_state.json` entry."""
    digests: dict[str, str | None] = {"tensors": None, "state": None}
    if write_files:
        digests = _write_state_files(state, Path(folder), HYBRID_STATE_FILE, HYBRID_STATE_JSON)
    return {
        "format_version": FORMAT_VERSION,
        "tensor_file": HYBRID_STATE_FILE,
        "state_file": HYBRID_STATE_JSON,
        "sha256": digests,
        "summary": _summary(summary),
    }


def save_sharded_engine_state(
    state: dict[str, Any],
    folder: str | os.PathLike,
    rank: int,
    gather: Callable[[Any], list[Any]],
    summary: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Every rank writes its own pair of files; `gather` (a collective, rank order) collects the names
    and checksums, so the saving rank's entry covers all ranks' files."""
    names = rank_file_names(rank)
    os.makedirs(folder, exist_ok=True)
    digests = _write_state_files(state, Path(folder), names["tensor_file"], names["state_file"])
    ranks = gather({**names, "sha256": digests})
    return {
        "format_version": FORMAT_VERSION,
        "sharding": {"world_size": len(ranks)},
        "ranks": ranks,
        "summary": _summary(summary),
    }


def rank_file_names(rank: int) -> dict[str, str]:
    return {
        "tensor_file": f"hybrid_state_rank{rank}.safetensors",
        "state_file": f"hybrid_state_rank{rank}.json.gz",
    }


def _write_state_files(
    state: dict[str, Any], folder: Path, tensor_file: str, state_file: str
) -> dict[str, str]:
    """The tensors to a safetensors file and the rest to JSON, each atomically; their SHA-256."""
    tree, tensors = split_state(state)
    contiguous = {name: t.detach().cpu().contiguous() for name, t in tensors.items()}
    metadata = {"format": "pt", "hf_hybrid_format": str(FORMAT_VERSION)}
    digest = _write_atomically(folder / tensor_file, lambda tmp: save_file(contiguous, str(tmp), metadata))
    return {"tensors": digest, "state": write_json(folder / state_file, tree)}


def _summary(summary: dict[str, Any] | None) -> dict[str, Any]:
    return {key: (summary or {}).get(key) for key in _SUMMARY_KEYS}


def sharding_problem(entry: dict[str, Any], world_size: int) -> str | None:
    """Why an engine sharded over `world_size` ranks (1: unsharded) cannot load the entry (None: it can)."""
    saved = int((entry.get("sharding") or {}).get("world_size", 1))
    # the rank is this comparison's own placeholder: only the world sizes are compared here
    return describe_sharding_mismatch({"world_size": saved, "rank": 0}, {"world_size": world_size, "rank": 0})


def rank_pair(entry: dict[str, Any], rank: int) -> dict[str, Any]:
    """The single-pair entry of `rank`'s files (an unsharded entry is every rank's pair)."""
    if "ranks" not in entry:
        return entry
    ranks = entry["ranks"]
    if not 0 <= rank < len(ranks):
        raise HybridCheckpointError(
            f"the hybrid state has no files for rank {rank} (saved by {len(ranks)} ranks)"
        )
    return {"format_version": entry.get("format_version"), **ranks[rank]}


_HINT = "set `hybrid_restart_engine=True` to resume with a fresh engine instead"


def _verified_file(
    entry: dict[str, Any], folder: str | os.PathLike, name_key: str, default: str, sha_key: str
) -> Path:
    """The path of one of the entry's files, present and matching its recorded checksum."""
    path = Path(folder) / entry.get(name_key, default)
    if not path.is_file():
        raise HybridCheckpointError(f"{path} is missing but trainer_state.json has a hybrid state; {_HINT}")
    expected = (entry.get("sha256") or {}).get(sha_key)
    if expected is not None and file_sha256(path) != expected:
        raise HybridCheckpointError(f"{path} is corrupt or truncated (checksum mismatch); {_HINT}")
    return path


def read_engine_tree(entry: dict[str, Any], folder: str | os.PathLike) -> dict[str, Any]:
    """The readable engine state (tensors still as references), checked against the entry's checksum."""
    if entry.get("format_version") != FORMAT_VERSION:
        raise HybridCheckpointError(
            f"{folder}: hybrid state format {entry.get('format_version')!r} is not supported (this hf_hybrid "
            f"reads {FORMAT_VERSION}); upgrade hf_hybrid or {_HINT}"
        )
    path = _verified_file(entry, folder, "state_file", HYBRID_STATE_JSON, "state")
    try:
        tree = read_json(path)
    except (ValueError, OSError, EOFError, zlib.error) as exc:
        raise HybridCheckpointError(f"{path} cannot be read ({exc}); {_HINT}") from exc
    if not isinstance(tree, dict):
        raise HybridCheckpointError(f"{path} does not hold an engine state; {_HINT}")
    return tree


def load_engine_state(entry: dict[str, Any], folder: str | os.PathLike) -> dict[str, Any]:
    """Rebuild the engine state from the checkpoint's files, or raise HybridCheckpointError."""
    tree = read_engine_tree(entry, folder)
    path = _verified_file(entry, folder, "tensor_file", HYBRID_STATE_FILE, "tensors")
    try:
        tensors = load_file(str(path))
    except Exception as exc:  # safetensors raises several types for damaged files
        raise HybridCheckpointError(f"{path} cannot be read ({exc}); {_HINT}") from exc
    try:
        return join_state(tree, tensors)
    except (KeyError, TypeError) as exc:
        raise HybridCheckpointError(f"{folder}: the hybrid state is damaged ({exc}); {_HINT}") from exc


def read_json(path: str | os.PathLike) -> Any:
    """A JSON file of the hybrid state, gzip-compressed when its name ends in `.gz` (older saves: plain)."""
    data = Path(path).read_bytes()
    return json.loads(gzip.decompress(data) if str(path).endswith(".gz") else data)


def write_json(path: Path, obj: Any) -> str:
    """`obj` as compact JSON, gzip-compressed with no timestamp (equal states give equal bytes); its
    SHA-256."""
    data = gzip.compress(json.dumps(obj, separators=(",", ":")).encode(), mtime=0)
    return _write_atomically(path, lambda tmp: tmp.write_bytes(data))


def _write_atomically(path: Path, write: Callable[[Path], Any]) -> str:
    """Write `path` through a temporary file; returns its SHA-256."""
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    digest = file_sha256(tmp)
    os.replace(tmp, path)
    return digest


def load_timeline(folder: str | os.PathLike) -> list[dict[str, Any]]:
    for name in (HYBRID_TIMELINE_FILE, _OLD_TIMELINE_FILE):
        path = Path(folder) / name
        if path.is_file():
            return read_json(path)
    return []


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def last_complete_checkpoint(output_dir: str | os.PathLike, need_hybrid_state: bool = True) -> str | None:
    """Newest `checkpoint-N` whose save finished (None: no checkpoint at all). trainer_state.json is
    written last, so it (and the hybrid files its entry names, if `need_hybrid_state`) marks a complete
    save; newer half-written folders are skipped with a warning, and none complete is refused."""
    root = Path(output_dir)
    if not root.is_dir():
        return None
    folders = [p for p in root.iterdir() if p.is_dir() and _CHECKPOINT_DIR.match(p.name)]
    skipped: list[tuple[Path, str]] = []
    for folder in sorted(folders, key=_checkpoint_step, reverse=True):
        missing = _missing_files(folder, need_hybrid_state)
        if not missing:
            if skipped:
                logger.warning(
                    "hf_hybrid: skipping checkpoints whose save did not finish (%s); resuming from %s, so "
                    "steps %d-%d will be trained again",
                    "; ".join(f"{earlier} lacks {files}" for earlier, files in skipped),
                    folder.name,
                    _checkpoint_step(folder) + 1,
                    _checkpoint_step(skipped[0][0]),
                )
            return str(folder)
        skipped.append((folder, missing))
    if not skipped:
        return None
    details = "; ".join(f"{folder.name} lacks {missing}" for folder, missing in skipped)
    hybrid_only = all(_missing_files(folder, need_hybrid_state=False) == "" for folder, _ in skipped)
    escape = (
        "set `hybrid_restart_engine=True` to resume the newest one with a new engine, or remove them to "
        "train from step 0"
        if hybrid_only
        else "remove them to train from step 0"
    )
    raise HybridCheckpointError(f"no checkpoint in {root} can be resumed ({details}); {escape}")


def _checkpoint_step(folder: Path) -> int:
    return int(_CHECKPOINT_DIR.match(folder.name).group(1))


def _missing_files(folder: Path, need_hybrid_state: bool = True) -> str:
    """What a checkpoint folder lacks to be resumable ('' when complete)."""
    if not (folder / TRAINER_STATE_FILE).is_file():
        return TRAINER_STATE_FILE
    try:
        entry = read_engine_entry(folder)
    except (OSError, json.JSONDecodeError):
        return f"a readable {TRAINER_STATE_FILE}"
    if entry is None or not need_hybrid_state:
        return ""
    pairs = entry.get("ranks") or [entry]
    files = [
        name
        for pair in pairs
        for name in (pair.get("tensor_file", HYBRID_STATE_FILE), pair.get("state_file", HYBRID_STATE_JSON))
    ]
    return ", ".join(name for name in files if not (folder / name).is_file())


def read_engine_entry(folder: str | os.PathLike) -> dict[str, Any] | None:
    """The hybrid entry of a checkpoint's trainer_state.json, or None (no file, or a plain-Trainer save)."""
    state_file = Path(folder) / TRAINER_STATE_FILE
    if not state_file.is_file():
        return None
    state = json.loads(state_file.read_text())
    saved = (state.get("stateful_callbacks") or {}).get(HybridStateCallback.__name__) or {}
    entry = saved.get("attributes", {}).get("engine_state") if isinstance(saved, dict) else None
    return entry if isinstance(entry, dict) else None


class EngineCheckpoints:
    """Saves and restores the hybrid engine with every Trainer checkpoint: `check` before a resume loads
    any weight, `save` beside the optimizer, `restore` once the engine is built; `callback` carries the
    entry into `trainer_state.json`."""

    def __init__(self, restart: bool, rename: Callable[[str], str] = str) -> None:
        self.restart = restart
        self.rename = rename
        self.callback = HybridStateCallback()

    def check(self, checkpoint: str, config: Any, params: dict[str, Any], world_size: int) -> None:
        """Refuse a checkpoint whose hybrid state cannot fit, before its weights are even loaded."""
        entry = read_engine_entry(checkpoint)
        if entry is None or self.restart:
            return
        problem = sharding_problem(entry, world_size)
        if not problem:  # configuration and parameter shapes are the same in every rank's file
            state = read_engine_tree(rank_pair(entry, 0), checkpoint)
            try:
                problem = describe_mismatch(
                    state["config"], state["parameters"], config, params, rename=self.rename
                )
            except (KeyError, TypeError) as exc:
                problem = f"its hybrid state is damaged ({exc!r})"
        if problem:
            raise HybridCheckpointError(_cannot_resume(checkpoint, problem))

    def save(self, engine: Any, timeline: list[dict[str, Any]], output_dir: str, should_save: bool) -> None:
        """Every rank: the state files (each rank its own under FSDP2), the entry, the timeline."""
        shards = engine.shards
        if shards.sharded:
            gather = functools.partial(_gather, shards=shards)
            state, stats = engine.state_dict(), engine.stats()
            entry = save_sharded_engine_state(state, output_dir, shards.rank, gather, summary=stats)
        else:
            entry = save_engine_state(
                engine.state_dict(), output_dir, write_files=should_save, summary=engine.stats()
            )
        self.callback.engine_state = entry
        if should_save:
            write_json(Path(output_dir) / HYBRID_TIMELINE_FILE, timeline)

    def restore(self, engine: Any, checkpoint: str, warmup_steps: int) -> list[dict[str, Any]]:
        """Load the saved engine into `engine` (or restart it); return the run's timeline so far."""
        entry = read_engine_entry(checkpoint)
        if self.restart:
            return self._restart(engine, checkpoint, entry, warmup_steps)
        if entry is None:
            logger.warning(
                "hf_hybrid: %s has no hybrid state (saved by the plain Trainer?); the engine starts fresh "
                "with warmup at this step",
                checkpoint,
            )
            return []
        problem = sharding_problem(entry, engine.shards.world_size)
        if problem:
            raise HybridCheckpointError(f"cannot resume the hybrid engine from {checkpoint}: {problem}")
        state = load_engine_state(rank_pair(entry, engine.shards.rank), checkpoint)
        try:
            engine.load_state_dict(state)
        except (ValueError, KeyError, TypeError) as exc:
            raise HybridCheckpointError(_cannot_resume(checkpoint, str(exc))) from exc
        return load_timeline(checkpoint)

    def _restart(self, engine: Any, checkpoint: str, entry: dict[str, Any] | None, warmup_steps: int) -> list:
        """A new engine, not a new history: what it learnt starts over; the counters and timeline go on."""
        carried = "the phase timeline"
        if entry is not None:
            try:
                engine.continue_accounting(read_engine_tree(rank_pair(entry, 0), checkpoint))
                carried = "the counters, the engine's time and peak bytes, and the phase timeline"
            except (HybridCheckpointError, KeyError, TypeError, ValueError) as exc:
                logger.warning(
                    "hf_hybrid: the counters of %s cannot be read (%s); they restart at 0", checkpoint, exc
                )
        logger.warning(
            "hf_hybrid: hybrid_restart_engine=True: a new engine from %s. The predictor, the loss "
            "forecaster, the horizon bandit, the residual history and the divergence statistics start over, "
            "with a new warmup of %d steps; %s carry on.",
            checkpoint,
            warmup_steps,
            carried,
        )
        return load_timeline(checkpoint)


def _cannot_resume(checkpoint: str, problem: str) -> str:
    return (
        f"cannot resume the hybrid engine from {checkpoint}: {problem}. Resume with the same hybrid "
        "configuration and trainable parameters, or set `hybrid_restart_engine=True` to start afresh."
    )


def _gather(obj: Any, shards: Any) -> list[Any]:
    """`obj` of every rank of the engine's shard group, in rank order (a collective)."""
    gathered: list[Any] = [None] * shards.world_size
    dist.all_gather_object(gathered, obj, group=shards.group)
    return gathered
