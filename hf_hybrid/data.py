"""The built-in default corpus: the Python standard library's own source, as bytes.

It exists on every machine that runs Python, nobody here wrote it, and it needs no download and no
tokenizer (byte-level, vocabulary 256). Files are split into train/eval by a hash of their path, so
the split is stable across machines and Python patch releases.
"""

from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

from datasets import Dataset

BYTE_VOCAB_SIZE = 256
_SKIPPED_DIRS = {"test", "tests", "idlelib", "site-packages", "dist-packages", "lib2to3", "__pycache__"}


def stdlib_source_files() -> list[Path]:
    """Sorted `.py` files of the running interpreter's standard library (tests and vendored code left out)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [
        path
        for path in root.rglob("*.py")
        if not _SKIPPED_DIRS.intersection(path.relative_to(root).parts[:-1])
    ]
    if not files:
        raise FileNotFoundError(f"no standard-library sources found under {root}")
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def is_eval_file(path: Path, eval_percent: int) -> bool:
    digest = hashlib.sha256(path.name.encode()).digest()
    return digest[0] % 100 < eval_percent


def stdlib_lm_datasets(
    block_size: int = 128, train_blocks: int = 4096, eval_blocks: int = 256, eval_percent: int = 10
) -> tuple[Dataset, Dataset]:
    """Causal-LM blocks of `block_size` bytes: (train, eval), `input_ids` and `labels` (identical)."""
    if block_size < 8:
        raise ValueError(f"`block_size` must be >= 8, got {block_size}")
    if train_blocks < 1 or eval_blocks < 1:
        raise ValueError(f"`train_blocks` and `eval_blocks` must be >= 1, got {train_blocks}, {eval_blocks}")
    train: list[list[int]] = []
    evaluation: list[list[int]] = []
    for path in stdlib_source_files():
        target = evaluation if is_eval_file(path, eval_percent) else train
        limit = eval_blocks if target is evaluation else train_blocks
        if len(target) >= limit:
            if len(train) >= train_blocks and len(evaluation) >= eval_blocks:
                break
            continue
        data = path.read_bytes()
        for start in range(0, len(data) - block_size + 1, block_size):
            if len(target) >= limit:
                break
            target.append(list(data[start : start + block_size]))
    if len(train) < train_blocks or len(evaluation) < eval_blocks:
        raise ValueError(
            f"the standard library yielded {len(train)} train / {len(evaluation)} eval blocks "
            f"of {block_size} bytes, fewer than the {train_blocks} / {eval_blocks} asked for"
        )
    return _as_dataset(train), _as_dataset(evaluation)


def _as_dataset(blocks: list[list[int]]) -> Dataset:
    return Dataset.from_dict({"input_ids": blocks, "labels": blocks})
