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


STDLIB_PACKAGES = ("asyncio", "email", "xml", "unittest", "multiprocessing", "importlib", "http", "urllib")


def stdlib_package_snippets(
    chars: int = 256,
    train_per_label: int = 256,
    eval_per_label: int = 32,
    packages: tuple[str, ...] = STDLIB_PACKAGES,
) -> tuple[Dataset, Dataset, list[str]]:
    """A real labelled task nobody here wrote: which stdlib package does this source snippet come from?

    Columns `text` and `label`; returns (train, eval, label names). Within each package every fifth
    file (sorted by path) is held out, so eval snippets come from files never seen in training.
    """
    if chars < 16:
        raise ValueError(f"`chars` must be >= 16, got {chars}")
    root = Path(sysconfig.get_paths()["stdlib"])
    splits: dict[str, dict[str, list]] = {
        "train": {"text": [], "label": []},
        "eval": {"text": [], "label": []},
    }
    sources = stdlib_source_files()
    for label, package in enumerate(packages):
        files = [p for p in sources if p.relative_to(root).parts[0] == package]
        if len(files) < 5:
            raise ValueError(f"package {package!r} has {len(files)} source files here; need >= 5")
        for split, wanted, chosen in (
            ("train", train_per_label, [f for i, f in enumerate(files) if i % 5 != 4]),
            ("eval", eval_per_label, [f for i, f in enumerate(files) if i % 5 == 4]),
        ):
            snippets = _snippets(chosen, chars, wanted)
            splits[split]["text"].extend(snippets)
            splits[split]["label"].extend([label] * len(snippets))
    return Dataset.from_dict(splits["train"]), Dataset.from_dict(splits["eval"]), list(packages)


def _snippets(files: list[Path], chars: int, wanted: int) -> list[str]:
    """Up to `wanted` non-blank `chars`-long pieces, taken round-robin over the files for variety."""
    texts = [f.read_text(encoding="utf-8", errors="replace") for f in files]
    pieces = [[t[i : i + chars] for i in range(0, len(t) - chars + 1, chars)] for t in texts]
    out: list[str] = []
    for index in range(max((len(p) for p in pieces), default=0)):
        for file_pieces in pieces:
            if index < len(file_pieces) and file_pieces[index].strip():
                out.append(file_pieces[index])
                if len(out) == wanted:
                    return out
    return out
