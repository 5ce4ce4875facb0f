"""`instruct_docstrings`: an instruction fine-tune whose examples vary in length the way real ones do.

Each example: a stdlib function's or class's signature (the prompt, labels -100), then its docstring's
first paragraph and the end-of-text byte 0, cut at `seq_len`, from files the pretrained decoder
(`decoder.py`) never saw; a fifth of each file's examples is held out for eval (by a hash of the file and
the example's place in it), only from files the training set draws from: eval is the training distribution,
clustered by file. Batches are padded to their longest example (`PadToLongest`) and the task is priced per
token.
"""

from __future__ import annotations

import ast
import hashlib
import random
import sysconfig
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from datasets import Dataset
from torch import nn

from ..data import stdlib_source_files
from .decoder import FINE_TUNE_PACKAGE, Recipe, pretrained_decoder, recipe_for
from .methods.packing import IGNORE, PadToLongest, length_spread
from .task import BenchTask

EOS = 0  # the decoder's end-of-text byte (`bos_token_id = eos_token_id = 0`)
EVAL_PERCENT = 20  # of each file's examples


@dataclass(frozen=True)
class Pair:
    prompt: bytes
    response: bytes
    document: str  # the file it comes from, relative to the standard library


def signature(node: ast.AST) -> str:
    """`def name(args) -> ret:` or `class Name(bases):` as the source would write it."""
    if isinstance(node, ast.ClassDef):
        bases = ", ".join(ast.unparse(b) for b in [*node.bases, *node.keywords])
        return f"class {node.name}({bases}):" if bases else f"class {node.name}:"
    returns = f" -> {ast.unparse(node.returns)}" if node.returns is not None else ""
    prefix = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
    return f"{prefix} {node.name}({ast.unparse(node.args)}){returns}:"


def docstring_pairs(path: Path, document: str) -> list[Pair]:
    """Every function, method and class of one file with a docstring, in the file's order."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return []
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    pairs = []
    for node in sorted((n for n in ast.walk(tree) if isinstance(n, kinds)), key=lambda n: n.lineno):
        doc = ast.get_docstring(node, clean=True)
        summary = doc.split("\n\n")[0].strip() if doc else ""
        if summary:
            prompt = (signature(node) + "\n").encode("utf-8")
            pairs.append(Pair(prompt, summary.encode("utf-8"), document))
    return pairs


def unseen_files(recipe: Recipe | None = None) -> list[Path]:
    """The standard-library files after those the decoder's pretraining read (the last one counts as read)."""
    recipe = recipe or Recipe()
    files = stdlib_source_files()
    blocks = 0
    for index, path in enumerate(files):
        if FINE_TUNE_PACKAGE in path.parts:
            continue
        size = path.stat().st_size
        blocks += (size - recipe.seq_len) // recipe.seq_len + 1 if size >= recipe.seq_len else 0
        if blocks >= recipe.train_blocks:
            return files[index + 1 :]
    raise ValueError("the decoder's pretraining read the whole standard library: no unseen files are left")


def is_eval_example(document: str, index: int) -> bool:
    """Whether the `index`-th example of `document` is held out (stable across machines)."""
    return hashlib.sha256(f"{document}:{index}".encode()).digest()[0] % 100 < EVAL_PERCENT


def encode(pair: Pair, seq_len: int) -> dict[str, list[int]] | None:
    """Prompt (labels -100), response and EOS, cut at `seq_len`; None when the prompt takes over half."""
    if len(pair.prompt) > seq_len // 2:
        return None
    ids = [*pair.prompt, *pair.response, EOS][:seq_len]
    labels = [IGNORE] * len(pair.prompt) + ids[len(pair.prompt) :]
    return {"input_ids": ids, "labels": labels}


@lru_cache(maxsize=1)
def all_pairs() -> tuple[Pair, ...]:
    """The pairs of every file the default decoder never saw (the tiny decoder saw fewer files)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    pairs: list[Pair] = []
    for path in unseen_files():
        pairs += docstring_pairs(path, path.relative_to(root).as_posix())
    return tuple(pairs)


@lru_cache(maxsize=4)
def instruct_split(size: Any) -> tuple[Any, Any, tuple[int, ...], tuple[str, ...], frozenset[str]]:
    """(train, eval, each eval example's document number, the eval documents, the documents trained on) at
    `size`."""
    train: list[tuple[dict[str, list[int]], str]] = []
    held_out: list[tuple[dict[str, list[int]], str]] = []
    places: dict[str, int] = {}
    for pair in all_pairs():
        index = places[pair.document] = places.get(pair.document, -1) + 1
        example = encode(pair, size.seq_len)
        if example is not None:
            (held_out if is_eval_example(pair.document, index) else train).append((example, pair.document))
    if len(train) < size.train_examples:
        raise ValueError(f"the docstrings gave {len(train)} train examples, fewer than {size.train_examples}")
    chosen_train = [train[i] for i in random.Random(0).sample(range(len(train)), size.train_examples)]
    trained = {document for _, document in chosen_train}
    held_out = [(example, document) for example, document in held_out if document in trained]
    if len(held_out) < size.eval_examples:
        raise ValueError(
            f"the docstrings gave {len(held_out)} eval examples from the files trained on, fewer than "
            f"{size.eval_examples}"
        )
    chosen = [held_out[i] for i in sorted(random.Random(0).sample(range(len(held_out)), size.eval_examples))]
    documents = tuple(sorted({document for _, document in chosen}))
    number = {name: k for k, name in enumerate(documents)}
    train_set = Dataset.from_list([example for example, _ in chosen_train])
    eval_set = Dataset.from_list([example for example, _ in chosen])
    clusters = tuple(number[document] for _, document in chosen)
    return train_set, eval_set, clusters, documents, frozenset(trained)


def eval_clusters(size: Any) -> list[int]:
    """Each eval example's document (its file, numbered in sorted order): their losses move together."""
    return list(instruct_split(size)[2])


def instruct_model(size: Any, seed: int) -> nn.Module:
    return pretrained_decoder(recipe_for(size.seq_len), seed, lora=False)


def finish_instruct(task: BenchTask, size: Any) -> None:
    """Per-batch padding (so a price per token), each eval example's document, the length spread."""
    task.data_collator = PadToLongest(pad_token_id=EOS)
    task.eval_clusters = eval_clusters(size)
    spread = length_spread([len(ids) for ids in task.train["input_ids"]], size.batch_size)
    task.info.update(lengths=spread.quantiles, padding_share=round(spread.padding_share, 4))


# `tasks.py` builds the preset from these (its `Task` and `Any`)
INSTRUCT_SIZES = {
    "tiny": {"steps": 8, "batch_size": 4, "seq_len": 32, "train_examples": 64, "eval_examples": 16},
    "quick": {"steps": 100, "batch_size": 8, "seq_len": 128, "train_examples": 1024, "eval_examples": 256},
    "full": {"steps": 400, "batch_size": 8, "seq_len": 128, "train_examples": 3200, "eval_examples": 960},
}
INSTRUCT_PRESET = {
    "name": "instruct_docstrings",
    "description": (
        "byte-level GPT-2 (4x256) pretrained on stdlib source, fine-tuned to answer a signature with its "
        "docstring's summary (files it never saw); examples of varied length padded per batch"
    ),
    "learning_rate": 5e-4,
    "data": lambda size: instruct_split(size)[:2],
    "model": instruct_model,
    "finish": finish_instruct,
}
