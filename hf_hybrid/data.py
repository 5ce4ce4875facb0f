"""Datasets of the training scripts: the built-in stdlib corpora and the user's own text.

The built-in corpus is the Python standard library's source: on every machine, no download, no
tokenizer (bytes); split by a hash of the file name, stable across machines. A user's data is a local
file or a Hub dataset (`datasets.load_dataset`), cut into blocks as `run_clm.py` does, or labelled text.
"""

from __future__ import annotations

import hashlib
import sysconfig
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # `datasets` takes ~2 s to import: only where data is built, not for `--help`
    from datasets import Dataset, DatasetDict

BYTE_VOCAB_SIZE = 256
TEXT_FILE_BUILDERS = {".txt": "text", ".csv": "csv", ".json": "json", ".jsonl": "json"}
STDLIB = "stdlib"  # built-in causal-LM corpus
STDLIB_PACKAGES_DATASET = "stdlib_packages"  # built-in classification task
STDLIB_TRAIN_BLOCKS, STDLIB_EVAL_BLOCKS = 4096, 256
_CARD_NAMES = {STDLIB: "Python standard library source", STDLIB_PACKAGES_DATASET: "stdlib package snippets"}


class DataError(ValueError):
    """A problem with the data that the user can fix; `hf-hybrid train` prints it without a traceback."""


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
    _check_blocks(train, evaluation, block_size, train_blocks, eval_blocks)
    return _as_dataset(train), _as_dataset(evaluation)


def _check_blocks(
    train: list, evaluation: list, block_size: int, train_blocks: int, eval_blocks: int
) -> None:
    if len(train) < train_blocks or len(evaluation) < eval_blocks:
        raise DataError(
            f"the standard library yielded {len(train)} train / {len(evaluation)} eval blocks "
            f"of {block_size} bytes, fewer than the {train_blocks} / {eval_blocks} asked for"
        )


def _as_dataset(blocks: list[list[int]]) -> Dataset:
    from datasets import Dataset

    return Dataset.from_dict({"input_ids": blocks, "labels": blocks})


STDLIB_PACKAGES = ("asyncio", "email", "xml", "unittest", "multiprocessing", "importlib", "http", "urllib")


def stdlib_package_snippets(
    chars: int = 256,
    train_per_label: int = 256,
    eval_per_label: int = 32,
    packages: tuple[str, ...] = STDLIB_PACKAGES,
    held_out: tuple[int, ...] = (4,),
) -> tuple[Dataset, Dataset, list[str]]:
    """Which stdlib package does this source snippet come from: (train, eval, label names). The files at
    positions `held_out` of every five are held out, so eval snippets come from files never trained on."""
    from datasets import Dataset

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
            raise DataError(f"package {package!r} has {len(files)} source files here; need >= 5")
        for split, wanted, chosen in (
            ("train", train_per_label, [f for i, f in enumerate(files) if i % 5 not in held_out]),
            ("eval", eval_per_label, [f for i, f in enumerate(files) if i % 5 in held_out]),
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


def held_out_chunks(
    documents: Iterable[Sequence[Any]], train_wanted: int, eval_wanted: int, chunk: int, every: int
) -> tuple[list[Any], list[Any], list[int]]:
    """Each document cut into chunks of `chunk` items, one chunk in `every` held out: (train items, eval
    items, each eval item's document number). An eval chunk comes only from a document that also gave
    training chunks, so eval is the training distribution (held-out chunks of the documents trained on,
    never a document seen only in eval); its clusters are those documents, whose chunks move together
    (by-chunk clusters understate the error 1.2-1.5x). Raises `DataError` when the documents run out:
    `every` must leave enough held-out chunks in the documents the training set reaches."""
    train: list[Any] = []
    evaluation: list[Any] = []
    clusters: list[int] = []
    counter = 0
    for number, items in enumerate(documents):
        trained = False
        for start in range(0, len(items), chunk):
            piece = list(items[start : start + chunk])
            held = counter % every == every // 2
            counter += 1
            if held and trained and len(evaluation) < eval_wanted:
                evaluation += piece
                clusters += [number] * len(piece)
            elif not held and len(train) < train_wanted:
                train += piece
                trained = True
        if len(train) >= train_wanted and (len(evaluation) >= eval_wanted or not trained):
            break
    if len(evaluation) < eval_wanted:
        raise DataError(
            f"the documents gave {len(evaluation)} held-out items from the documents trained on, fewer than "
            f"{eval_wanted}: hold out more than one chunk in {every}"
        )
    return train[:train_wanted], evaluation[:eval_wanted], clusters[:eval_wanted]


def stdlib_lm_chunks(
    block_size: int, train_blocks: int, eval_blocks: int, chunk: int = 8, every: int = 8
) -> tuple[Dataset, Dataset, list[int]]:
    """Stdlib byte blocks with chunks of every file held out (the arena's `clm_stdlib`), and the chunks."""
    documents = (
        [list(data[i : i + block_size]) for i in range(0, len(data) - block_size + 1, block_size)]
        for data in (path.read_bytes() for path in stdlib_source_files())
    )
    train, evaluation, clusters = held_out_chunks(documents, train_blocks, eval_blocks, chunk, every)
    _check_blocks(train, evaluation, block_size, train_blocks, eval_blocks)
    return _as_dataset(train), _as_dataset(evaluation), clusters


def stdlib_package_chunks(
    chars: int, train_per_label: int, eval_per_label: int, packages: tuple[str, ...] = STDLIB_PACKAGES
) -> tuple[Dataset, Dataset, list[int]]:
    """`stdlib_package_snippets`' task with chunks of 4 snippets of every file held out (one in 3, so
    that the eval set fits in the files the training set reaches): (train, eval, each eval snippet's
    file)."""
    from datasets import Dataset

    root = Path(sysconfig.get_paths()["stdlib"])
    sources = stdlib_source_files()
    splits = {"train": {"text": [], "label": []}, "eval": {"text": [], "label": []}}
    clusters: list[int] = []
    for label, package in enumerate(packages):
        files = [p for p in sources if p.relative_to(root).parts[0] == package]
        texts = [f.read_text(encoding="utf-8", errors="replace") for f in files]
        pieces = [
            [t[i : i + chars] for i in range(0, len(t) - chars + 1, chars) if t[i : i + chars].strip()]
            for t in texts
        ]
        train, evaluation, numbers = held_out_chunks(pieces, train_per_label, eval_per_label, 4, 3)
        if len(train) < train_per_label:
            raise DataError(
                f"package {package!r} gave {len(train)} training snippets, fewer than {train_per_label}"
            )
        for split, texts_ in (("train", train), ("eval", evaluation)):
            splits[split]["text"] += texts_
            splits[split]["label"] += [label] * len(texts_)
        clusters += [label * 10**6 + n for n in numbers]  # file numbers restart with each package
    return Dataset.from_dict(splits["train"]), Dataset.from_dict(splits["eval"]), clusters


def card_dataset_name(dataset: str) -> str:
    """How a model card names `dataset`: what a built-in is, a local file by its name (not its path)."""
    if dataset in _CARD_NAMES:
        return _CARD_NAMES[dataset]
    path = Path(dataset)
    return path.name if path.is_file() else dataset


# ---- the user's data ----------------------------------------------------------------------------------


def load_text_dataset(
    dataset: str,
    config_name: str | None = None,
    columns: Sequence[str] = ("text",),
    validation_split_percentage: int = 5,
) -> DatasetDict:
    """`train` and `validation` splits of a local file or a Hub dataset, checked to hold `columns`; without
    a validation split, `validation_split_percentage` of `train` is held out (fixed seed)."""
    from datasets import DatasetDict, load_dataset

    path = Path(dataset)
    if path.is_file():
        builder = TEXT_FILE_BUILDERS.get(path.suffix.lower())
        if builder is None:
            raise DataError(
                f"`dataset` {path} must end in one of {sorted(TEXT_FILE_BUILDERS)}, or be a built-in or a "
                "Hub dataset name"
            )
        raw = load_dataset(builder, data_files={"train": str(path)})
    else:
        raw = load_dataset(dataset, config_name)
    if not isinstance(raw, DatasetDict) or "train" not in raw:
        raise DataError(f"dataset {dataset!r} has no `train` split")
    for column in columns:
        if column not in raw["train"].column_names:
            raise DataError(
                f"{column!r} is not a column of {dataset!r}; columns: {raw['train'].column_names} "
                "(choose with `--text_column` / `--label_column`)"
            )
    if "validation" not in raw:
        try:
            split = raw["train"].train_test_split(
                test_size=validation_split_percentage / 100, seed=0, shuffle=True
            )
        except ValueError as exc:  # too few rows to hold any out
            raise DataError(
                f"cannot hold out {validation_split_percentage}% of the {len(raw['train'])} rows of "
                f"{dataset!r} for evaluation: {exc}"
            ) from exc
        raw = DatasetDict(train=split["train"], validation=split["test"])
    return raw


def encode_texts(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """Token ids of each text; the UTF-8 bytes when there is no tokenizer (the byte-level models)."""
    if tokenizer is None:
        return [list(text.encode("utf-8")) for text in texts]
    return tokenizer(texts, add_special_tokens=False)["input_ids"]


def group_into_blocks(ids: list[list[int]], block_size: int) -> list[list[int]]:
    """Concatenate and cut into full blocks (the remainder is dropped), as run_clm.py's group_texts."""
    flat = [token for seq in ids for token in seq]
    return [flat[i : i + block_size] for i in range(0, len(flat) - block_size + 1, block_size)]


def lm_datasets(
    dataset: str,
    tokenizer: Any,
    block_size: int,
    *,
    config_name: str | None = None,
    text_column: str = "text",
    max_train: int | None = None,
    max_eval: int | None = None,
    validation_split_percentage: int = 5,
) -> tuple[Dataset, Dataset]:
    """(train, eval) causal-LM blocks of `block_size` tokens of `stdlib`, a local file or a Hub dataset;
    `max_train` / `max_eval` keep at most that many blocks."""
    if dataset == STDLIB:
        train_blocks, eval_blocks = max_train or STDLIB_TRAIN_BLOCKS, max_eval or STDLIB_EVAL_BLOCKS
        if tokenizer is None:
            return stdlib_lm_datasets(block_size, train_blocks=train_blocks, eval_blocks=eval_blocks)
        return tokenized_stdlib_lm_datasets(tokenizer, block_size, train_blocks, eval_blocks)
    raw = load_text_dataset(dataset, config_name, (text_column,), validation_split_percentage)
    train, evaluation = (
        _lm_blocks(raw[split], dataset, text_column, tokenizer, block_size, limit)
        for split, limit in (("train", max_train), ("validation", max_eval))
    )
    return train, evaluation


def _lm_blocks(
    split: Dataset, name: str, column: str, tokenizer: Any, block_size: int, limit: int | None
) -> Dataset:
    from datasets import Dataset

    def group(batch: dict[str, list[Any]]) -> dict[str, list[list[int]]]:
        blocks = group_into_blocks(encode_texts(tokenizer, [t for t in batch[column] if t]), block_size)
        return {"input_ids": blocks, "labels": [list(b) for b in blocks]}

    blocks = split.map(group, batched=True, batch_size=1000, remove_columns=split.column_names)
    if limit is not None:
        blocks = blocks.select(range(min(limit, len(blocks))))
    if len(blocks) == 0:
        raise DataError(
            f"no full block of {block_size} tokens in a split of {name!r}; use a smaller `--block_size` "
            "or more text"
        )
    return Dataset.from_dict(blocks[:]) if limit is not None else blocks


def tokenized_stdlib_lm_datasets(
    tokenizer: Any, block_size: int, train_blocks: int, eval_blocks: int, eval_percent: int = 10
) -> tuple[Dataset, Dataset]:
    """The stdlib corpus through a model's tokenizer; reads only as many files as the blocks need."""
    wanted = {"train": train_blocks, "eval": eval_blocks}
    ids: dict[str, list[int]] = {"train": [], "eval": []}
    for path in stdlib_source_files():
        split = "eval" if is_eval_file(path, eval_percent) else "train"
        if len(ids[split]) >= wanted[split] * block_size:
            if all(len(ids[s]) >= wanted[s] * block_size for s in ids):
                break
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        ids[split].extend(encode_texts(tokenizer, [text])[0])
    out = []
    for split in ("train", "eval"):
        blocks = group_into_blocks([ids[split]], block_size)[: wanted[split]]
        if not blocks:
            raise DataError(f"the standard library gave no {split} block of {block_size} tokens")
        out.append(_as_dataset(blocks))
    return out[0], out[1]


def labelled_text_datasets(
    dataset: str,
    *,
    config_name: str | None = None,
    text_column: str = "text",
    label_column: str = "label",
    max_train: int | None = None,
    max_eval: int | None = None,
    validation_split_percentage: int = 5,
) -> tuple[Dataset, Dataset, list[str]]:
    """(train, eval, label names), columns `text` and `label` (0..n-1): a `ClassLabel` keeps its names,
    other labels are numbered in sorted order; an eval label never seen in training is refused."""
    from datasets import ClassLabel, Dataset

    raw = load_text_dataset(dataset, config_name, (text_column, label_column), validation_split_percentage)
    feature = raw["train"].features[label_column]
    if isinstance(feature, ClassLabel):
        names = list(feature.names)
        index = {i: i for i in range(len(names))}
    else:
        values = sorted(set(raw["train"][label_column]), key=str)
        names = [str(v) for v in values]
        index = {v: i for i, v in enumerate(values)}
    if len(names) < 2:
        raise DataError(
            f"`label_column` {label_column!r} of {dataset!r} has {len(names)} label(s); need >= 2"
        )
    out = []
    for split, limit in (("train", max_train), ("validation", max_eval)):
        part = take(raw[split], limit)
        unseen = sorted({str(v) for v in part[label_column] if v not in index})
        if unseen:
            raise DataError(
                f"labels {unseen} of the {split} split of {dataset!r} are not in training: {names}"
            )
        texts = [str(t) for t in part[text_column]]
        out.append(Dataset.from_dict({"text": texts, "label": [index[v] for v in part[label_column]]}))
    return out[0], out[1], names


def take(split: Dataset, limit: int | None) -> Dataset:
    """At most `limit` examples, drawn with a fixed seed (a file sorted by label keeps every label)."""
    if limit is None or limit >= len(split):
        return split
    return split.shuffle(seed=0).select(range(limit))
