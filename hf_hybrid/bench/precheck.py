"""What `hf-hybrid bench` refuses before it imports anything heavy or reads more than a file's first line.

A misspelt method must not wait for 100,000 rows to be tokenized: `check_light` (first in
`bench_cli._dispatch`) checks the method names, the protocol's flags, the budget's geometry, and the
columns your task names against a CSV's header, a JSON-lines file's first record or saved features.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

from ..data import DataError
from .budget import Budgets

# The built-in method names, without importing them (torch); tests/bench/test_precheck.py checks the list.
BUILTIN_METHODS = (
    "args",
    "dropbp",
    "freeze",
    "group_by_length",
    "hybrid",
    "hybrid-predict",
    "null",
    "null-hybrid",
    "packing",
    "packing-naive",
    "peft",
    "plain",
    "selective-backprop",
)
DEFAULT_MAX_STEPS = 200  # a user task's budget without --max_steps (bench_cli._own_task)


def check_light(args: argparse.Namespace) -> None:
    """The checks that import nothing heavy; a DataError names the flag, the value and what is allowed."""
    if args.methods:
        check_method_names(args.methods)
    _check_protocol_flags(args)
    if args.dataset is not None and args.task_factory is None:
        columns = {"--text_column": args.text_column}
        if args.task != "causal_lm":
            columns["--label_column"] = args.label_column
        if getattr(args, "prompt_column", None) is not None:
            columns["--prompt_column"] = args.prompt_column
        for flag in ("--dataset", "--eval_dataset"):
            path = getattr(args, flag.removeprefix("--"))
            if path is not None:
                check_columns(flag, path, columns)


def check_method_names(specs: list[str]) -> None:
    """Each spec names a built-in method or has the form `module.path:Name` (imported before the data)."""
    if len(set(specs)) != len(specs):
        raise DataError(f"`--methods` lists a method twice: {list(specs)}")
    for spec in specs:
        name, _, rest = spec.strip().partition(":")
        if name in BUILTIN_METHODS or (rest and ("." in name or rest[:1].isupper())):
            continue
        raise DataError(
            f"unknown method {spec!r}; methods: {', '.join(BUILTIN_METHODS)}, or module.path:Name of a "
            "Trainer subclass or TrainerCallback (`hf-hybrid bench --list_methods` describes them)"
        )


def _check_protocol_flags(args: argparse.Namespace) -> None:
    if args.seeds is not None and (not args.seeds or len(set(args.seeds)) != len(args.seeds)):
        raise DataError(f"`--seeds` must be distinct seeds, at least one, got {list(args.seeds)}")
    if args.lr_multipliers is not None and any(not v > 0 for v in args.lr_multipliers):
        raise DataError(f"`--lr_multipliers` must be positive numbers, got {list(args.lr_multipliers)}")
    if args.widen is not None and args.widen < 0:
        raise DataError(f"`--widen` must be >= 0, got {args.widen}")
    if args.workers is not None and args.workers < 1:
        raise DataError(f"`--workers` must be >= 1, got {args.workers}")
    arena = not args.overhead and args.faults is None  # the measuring tools have no budgets to branch
    if arena and (args.max_steps is not None or args.model_name_or_path is not None):
        geometry = {"cooldown": args.cooldown_fraction, "decay": args.decay_shape}
        budgets = Budgets(
            max_steps=args.max_steps or DEFAULT_MAX_STEPS,
            **{k: v for k, v in geometry.items() if v is not None},
        )
        budgets.check()


def check_columns(flag: str, path: str, columns: dict[str, str]) -> None:
    """Refuse a column (`{flag naming it: column}`) the file's header lacks; nothing when it cannot tell."""
    found = columns_of(Path(path).expanduser())
    if found is None:
        return
    for which, column in columns.items():
        if column not in found:
            raise DataError(f"`{which}` {column!r} is not a column of {path}; its columns: {found}")


def columns_of(path: Path) -> list[str] | None:
    """The column names of a data file or `save_to_disk` folder, from its first line or its metadata."""
    if path.is_dir():  # its own `dataset_info.json`, or its `train` split's
        for info in (path / "dataset_info.json", path / "train" / "dataset_info.json"):
            if info.is_file():
                features = json.loads(info.read_text()).get("features")
                return list(features) if isinstance(features, dict) else None
        return None
    if not path.is_file():
        return None
    suffix = path.suffix.lower()
    if suffix == ".txt":
        return ["text"]  # `datasets`' text builder: one column
    with open(path, encoding="utf-8", errors="replace", newline="") as f:
        if suffix == ".csv":
            return next(csv.reader(f), None)
        if suffix in (".json", ".jsonl"):
            first = f.readline().strip()
            try:
                record = json.loads(first)
            except json.JSONDecodeError:  # a JSON document over several lines: told when it is read
                return None
            return list(record) if isinstance(record, dict) else None
    return None
