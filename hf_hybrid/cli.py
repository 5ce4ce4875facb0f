"""The `hf-hybrid` console script: `train`, `demo` and `bench`.

`hf-hybrid --version` and `hf-hybrid --help` answer without importing transformers (which takes ~10 s);
each subcommand imports what it needs.

    hf-hybrid demo                                   # plain Trainer vs HybridHFTrainer, a few minutes on CPU
    hf-hybrid train --output_dir out --max_steps 200 # the tiny built-in model on the stdlib corpus
    hf-hybrid train --model_name_or_path gpt2 --dataset corpus.txt --output_dir out --hybrid_warmup_steps 50
    hf-hybrid train args.json                        # every argument from a .json / .yaml file
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

TEXT_FILE_BUILDERS = {".txt": "text", ".json": "json", ".jsonl": "json"}
BUILTIN_MODEL_CONFIGS = ("tiny",)
ARGUMENT_FILE_SUFFIXES = (".json", ".yaml", ".yml")


def _version() -> str:
    try:
        return version("hf-hybrid")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "unknown"


# ---- `hf-hybrid train` arguments (HfArgumentParser dataclasses, run_clm.py style) ------------------


@dataclass
class ModelArguments:
    model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "Hub id or local directory of a causal LM (AutoModelForCausalLM + AutoTokenizer). "
            "Leave empty to train the built-in `--model_config` from scratch."
        },
    )
    model_config: str | None = field(
        default=None,
        metadata={
            "help": "Built-in model trained from scratch when no `--model_name_or_path` is given: `tiny` is "
            "a byte-level GPT-2 (2 layers x 64, vocabulary 256, 128 positions, no tokenizer).",
            "choices": list(BUILTIN_MODEL_CONFIGS),
        },
    )
    tokenizer_name: str | None = field(
        default=None, metadata={"help": "Tokenizer hub id or directory, if not the model's own."}
    )
    cache_dir: str | None = field(default=None, metadata={"help": "Where downloaded models are cached."})
    revision: str = field(default="main", metadata={"help": "Model revision (branch, tag or commit)."})
    trust_remote_code: bool = field(
        default=False, metadata={"help": "Allow model code from the Hub to run (only for repos you trust)."}
    )

    def __post_init__(self) -> None:
        if self.model_name_or_path is not None and self.model_config is not None:
            raise ValueError("pass either `--model_name_or_path` or `--model_config`, not both")
        if self.model_name_or_path is None and self.tokenizer_name is not None:
            raise ValueError(
                "`--tokenizer_name` needs `--model_name_or_path`; the built-in model is byte-level"
            )


@dataclass
class DataArguments:
    dataset: str = field(
        default="stdlib",
        metadata={
            "help": "`stdlib` (built-in: the Python standard library's source, offline), a local "
            ".txt/.json/.jsonl file, or a Hub dataset name (datasets.load_dataset)."
        },
    )
    dataset_config_name: str | None = field(
        default=None, metadata={"help": "Configuration name of a Hub dataset."}
    )
    text_column: str = field(default="text", metadata={"help": "Column holding the text (.json/.jsonl/Hub)."})
    block_size: int | None = field(
        default=None,
        metadata={
            "help": "Tokens per training block (default: the model's context, at most 1024; 128 for `tiny`)."
        },
    )
    max_train_samples: int | None = field(
        default=None, metadata={"help": "Keep at most this many training blocks (stdlib default: 4096)."}
    )
    max_eval_samples: int | None = field(
        default=None, metadata={"help": "Keep at most this many evaluation blocks (stdlib default: 256)."}
    )
    validation_split_percentage: int = field(
        default=5,
        metadata={
            "help": "Percentage of the training split held out for evaluation when there is no "
            "validation split."
        },
    )

    def __post_init__(self) -> None:
        for name in ("block_size", "max_train_samples", "max_eval_samples"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"`{name}` must be >= 1, got {value}")
        if not 0 < self.validation_split_percentage < 100:
            raise ValueError(
                f"`validation_split_percentage` must be in (0, 100), got {self.validation_split_percentage}"
            )


# ---- entry point ---------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hf-hybrid",
        description="Predictive training for the Hugging Face Trainer: skip backward passes when a "
        "predicted update can be trusted, fall back to full training when it cannot.",
    )
    parser.add_argument("--version", action="version", version=f"hf-hybrid {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="{train,demo,bench}")
    sub.add_parser(
        "train",
        help="train a causal LM with HybridHFTrainer (every TrainingArguments and hybrid_* field is a "
        "flag; `hf-hybrid train --help` lists them)",
        add_help=False,
    )
    _add_bench_parser(sub)
    demo = sub.add_parser(
        "demo",
        help="plain Trainer vs HybridHFTrainer on a small model, offline, a few minutes on CPU",
        description="Train a small byte-level GPT-2 on the Python standard library's source twice, with "
        "the plain transformers.Trainer and with HybridHFTrainer (same init, data, arguments and "
        "learning rate), and print what the phase machine did. A demo, not a benchmark.",
    )
    demo.add_argument(
        "--size",
        choices=["default", "tiny"],
        default="default",
        help="`tiny`: seconds, for tests (default: %(default)s)",
    )
    demo.add_argument(
        "--max-steps",
        type=_positive_int,
        default=None,
        help="optimizer steps per run (default: 600, or 60 with --size tiny)",
    )
    demo.add_argument(
        "--output-dir",
        default="hf_hybrid_demo",
        help="where both runs and demo_results.json go (default: ./%(default)s)",
    )
    demo.add_argument("--seed", type=int, default=0, help="model-init and data-order seed (default: 0)")
    demo.add_argument(
        "--learning-rate",
        type=_positive_float,
        default=1e-3,
        help="peak learning rate of both runs (default: %(default)g)",
    )
    demo.add_argument(
        "--batch-size",
        type=_positive_int,
        default=16,
        help="blocks of 128 bytes per step (default: %(default)s)",
    )
    demo.add_argument(
        "--json", metavar="PATH", default=None, help="also write the results table as JSON here"
    )
    return parser


def _add_bench_parser(sub: Any) -> None:
    bench = sub.add_parser(
        "bench",
        help="plain Trainer (tuned lr, several budgets) vs HybridHFTrainer vs a null control",
        description="Runs every task with the plain transformers.Trainer (a learning-rate sweep, then its "
        "frontier of step budgets at the best rate), HybridHFTrainer, and the null-predictor control, one "
        "after the other in this process; writes results.json, report.md and a plot per task.",
    )
    bench.add_argument(
        "--suite", choices=["tiny", "quick", "full"], default="quick", help="default: %(default)s"
    )
    bench.add_argument("--tasks", nargs="+", default=None, help="subset of the suite's tasks")
    bench.add_argument("--seeds", nargs="+", type=int, default=None, help="override the suite's seeds")
    bench.add_argument("--out", default=None, help="output folder (default: bench_results/<suite>)")
    bench.add_argument(
        "--hybrid",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a hybrid_* argument (repeatable), e.g. --hybrid hybrid_predictor=lowrank",
    )


def _parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """`hybrid_x=1` pairs, values typed by the HybridTrainingArguments field they set."""
    import dataclasses
    import typing

    from .args import HybridArgumentsMixin

    types = typing.get_type_hints(HybridArgumentsMixin)
    names = {f.name for f in dataclasses.fields(HybridArgumentsMixin)}
    out: dict[str, Any] = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or name not in names:
            raise ValueError(f"--hybrid expects FIELD=VALUE with FIELD one of {sorted(names)}, got {item!r}")
        kind = types[name]
        if kind is bool:
            out[name] = text.lower() in ("1", "true", "yes")
        elif kind in (int, float, str):
            out[name] = kind(text)
        else:  # `int | None`
            out[name] = None if text.lower() == "none" else int(text)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "train":
        # HfArgumentParser owns everything after `train` (including its own --help).
        return train_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if args.command == "demo":
        from .demo import run_demo

        run_demo(
            size=args.size,
            max_steps=args.max_steps,
            output_dir=args.output_dir,
            seed=args.seed,
            learning_rate=args.learning_rate,
            batch_size=args.batch_size,
            json_path=args.json,
        )
        return 0
    if args.command == "bench":
        from .bench import run_bench

        try:
            overrides = _parse_overrides(args.hybrid)
        except ValueError as exc:
            parser.error(str(exc))
        run_bench(args.suite, args.tasks, args.seeds, args.out, overrides)
        return 0
    parser.error(f"unknown command {args.command!r}")  # pragma: no cover - argparse rejects it first
    return 2


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


# ---- `hf-hybrid train` ---------------------------------------------------------------------------


def parse_train_args(argv: Sequence[str]) -> tuple[ModelArguments, DataArguments, Any]:
    """Flags, or a single .json/.yaml argument file; invalid values exit with the field named."""
    from .args import HybridTrainingArguments

    return parse_arguments(
        (ModelArguments, DataArguments, HybridTrainingArguments), argv, prog="hf-hybrid train"
    )  # type: ignore[return-value]


def parse_arguments(
    dataclass_types: Sequence[Any],
    argv: Sequence[str],
    defaults: dict[str, Any] | None = None,
    prog: str | None = None,
) -> tuple[Any, ...]:
    """`HfArgumentParser` over `dataclass_types`: flags, or a single .json/.yaml argument file.

    `defaults` replace the dataclasses' own defaults in both forms (the examples use it for small,
    CPU-sized runs). Invalid values exit with the field named, before any model is loaded.
    """
    from transformers import HfArgumentParser

    parser = HfArgumentParser(dataclass_types, prog=prog)
    parser.set_defaults(**(defaults or {}))
    try:
        if len(argv) == 1 and argv[0].endswith(ARGUMENT_FILE_SUFFIXES) and not argv[0].startswith("-"):
            return parser.parse_dict({**(defaults or {}), **_read_argument_file(Path(argv[0]))})
        return parser.parse_args_into_dataclasses(args=list(argv), look_for_args_file=False)
    except ValueError as exc:  # __post_init__ validation or unknown keys
        parser.error(str(exc))
        raise  # pragma: no cover - parser.error exits


def _read_argument_file(path: Path) -> dict[str, Any]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        values = json.loads(text)
    else:
        import yaml

        values = yaml.safe_load(text)
    if not isinstance(values, dict):
        raise ValueError(f"argument file {path} must hold a mapping of argument names to values")
    return values


def resume_target(value: str | bool | None) -> str | bool | None:
    """`--resume_from_checkpoint True` arrives as the string "True" (the field is `str | None`): that means
    the newest checkpoint in `output_dir`, "False" means no resume, anything else is a checkpoint path."""
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return True if value.lower() == "true" else None
    return value


def train_main(argv: Sequence[str]) -> int:
    model_args, data_args, training_args = parse_train_args(argv)
    logging.basicConfig(
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        level=training_args.get_process_log_level(),
    )
    import transformers
    from transformers import set_seed

    from .trainer import HybridHFTrainer

    transformers.utils.logging.set_verbosity(training_args.get_process_log_level())
    set_seed(training_args.seed)
    model, tokenizer = load_model_and_tokenizer(model_args)
    try:
        block_size = resolve_block_size(data_args, model)
        train_dataset, eval_dataset = load_lm_datasets(data_args, tokenizer, block_size)
    except ValueError as exc:  # a data problem the user can fix: say so without a traceback
        print(f"hf-hybrid train: error: {exc}", file=sys.stderr)
        return 2
    logger.info(
        "train blocks: %d, eval blocks: %d, block size %d",
        len(train_dataset),
        len(eval_dataset) if eval_dataset is not None else 0,
        block_size,
    )

    from transformers import default_data_collator

    trainer = HybridHFTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        data_collator=default_data_collator,
    )
    result = trainer.train(resume_from_checkpoint=resume_target(training_args.resume_from_checkpoint))
    trainer.save_model()
    metrics = dict(result.metrics)
    metrics["train_samples"] = len(train_dataset)
    trainer.log_metrics("train", metrics)
    trainer.save_metrics("train", metrics)
    trainer.save_state()
    if eval_dataset is not None:
        import math

        eval_metrics = trainer.evaluate()
        eval_metrics["eval_samples"] = len(eval_dataset)
        try:
            eval_metrics["perplexity"] = math.exp(eval_metrics["eval_loss"])
        except OverflowError:
            eval_metrics["perplexity"] = float("inf")
        trainer.log_metrics("eval", eval_metrics)
        trainer.save_metrics("eval", eval_metrics)
    trainer.create_model_card(dataset=data_args.dataset)  # with the "Hybrid training" section
    stats = trainer.hybrid_stats()
    if trainer.is_world_process_zero():
        Path(training_args.output_dir).mkdir(parents=True, exist_ok=True)
        (Path(training_args.output_dir) / "hybrid_stats.json").write_text(json.dumps(stats, indent=2) + "\n")
        print(json.dumps({"hybrid_stats": stats}, sort_keys=True))
    return 0


def load_model_and_tokenizer(model_args: ModelArguments) -> tuple[Any, Any]:
    """A pretrained causal LM and its tokenizer, or the built-in byte-level model and no tokenizer."""
    if model_args.model_name_or_path is None:
        from transformers import GPT2LMHeadModel

        from .demo import tiny_gpt2_config

        name = model_args.model_config or "tiny"
        logger.info("training the built-in %r model from scratch (byte-level, no tokenizer)", name)
        return GPT2LMHeadModel(tiny_gpt2_config()), None
    from transformers import AutoModelForCausalLM, AutoTokenizer

    common = dict(
        cache_dir=model_args.cache_dir,
        revision=model_args.revision,
        trust_remote_code=model_args.trust_remote_code,
    )
    tokenizer = AutoTokenizer.from_pretrained(
        model_args.tokenizer_name or model_args.model_name_or_path, **common
    )
    model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path, **common)
    return model, tokenizer


def _model_max_positions(model: Any) -> int | None:
    config = model.config
    for name in ("n_positions", "max_position_embeddings", "n_ctx", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def resolve_block_size(data_args: DataArguments, model: Any) -> int:
    limit = _model_max_positions(model)
    if data_args.block_size is None:
        return min(limit or 1024, 1024)
    if limit is not None and data_args.block_size > limit:
        raise ValueError(f"`block_size` {data_args.block_size} is longer than the model's context ({limit})")
    return data_args.block_size


def load_lm_datasets(data_args: DataArguments, tokenizer: Any, block_size: int) -> tuple[Any, Any]:
    """(train, eval) datasets of `input_ids`/`labels` blocks of `block_size` tokens."""
    if data_args.dataset == "stdlib":
        if tokenizer is None:
            from .data import stdlib_lm_datasets

            return stdlib_lm_datasets(
                block_size,
                train_blocks=data_args.max_train_samples or 4096,
                eval_blocks=data_args.max_eval_samples or 256,
            )
        return _tokenized_stdlib(data_args, tokenizer, block_size)
    raw = _load_raw_dataset(data_args)
    return tuple(
        _to_blocks(raw[split], data_args, tokenizer, block_size, limit)
        for split, limit in (
            ("train", data_args.max_train_samples),
            ("validation", data_args.max_eval_samples),
        )
    )


def _load_raw_dataset(data_args: DataArguments) -> Any:
    from datasets import DatasetDict, load_dataset

    path = Path(data_args.dataset)
    if path.is_file():
        builder = TEXT_FILE_BUILDERS.get(path.suffix.lower())
        if builder is None:
            raise ValueError(
                f"`--dataset` {path} must end in one of {sorted(TEXT_FILE_BUILDERS)}, or be `stdlib` or a "
                "Hub dataset name"
            )
        raw = load_dataset(builder, data_files={"train": str(path)})
    else:
        raw = load_dataset(data_args.dataset, data_args.dataset_config_name)
    if not isinstance(raw, DatasetDict) or "train" not in raw:
        raise ValueError(f"dataset {data_args.dataset!r} has no `train` split")
    if "validation" not in raw:
        split = raw["train"].train_test_split(
            test_size=data_args.validation_split_percentage / 100, seed=0, shuffle=True
        )
        raw = DatasetDict(train=split["train"], validation=split["test"])
    if data_args.text_column not in raw["train"].column_names:
        raise ValueError(
            f"`--text_column` {data_args.text_column!r} is not a column of {data_args.dataset!r}; "
            f"columns: {raw['train'].column_names}"
        )
    return raw


def _encode(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    if tokenizer is None:  # byte-level built-in model
        return [list(text.encode("utf-8")) for text in texts]
    return tokenizer(texts, add_special_tokens=False)["input_ids"]


def _blocks_from_ids(ids: list[list[int]], block_size: int) -> list[list[int]]:
    """Concatenate and cut into full blocks (the remainder is dropped), as run_clm.py's group_texts."""
    flat = [token for seq in ids for token in seq]
    return [flat[i : i + block_size] for i in range(0, len(flat) - block_size + 1, block_size)]


def _to_blocks(
    split: Any, data_args: DataArguments, tokenizer: Any, block_size: int, limit: int | None
) -> Any:
    from datasets import Dataset

    column = data_args.text_column

    def group(batch: dict[str, list[Any]]) -> dict[str, list[list[int]]]:
        blocks = _blocks_from_ids(_encode(tokenizer, [t for t in batch[column] if t]), block_size)
        return {"input_ids": blocks, "labels": [list(b) for b in blocks]}

    blocks = split.map(group, batched=True, batch_size=1000, remove_columns=split.column_names)
    if limit is not None:
        blocks = blocks.select(range(min(limit, len(blocks))))
    if len(blocks) == 0:
        raise ValueError(
            f"no full block of {block_size} tokens in a split of {data_args.dataset!r}; use a smaller "
            "`--block_size` or more text"
        )
    return Dataset.from_dict(blocks[:]) if limit is not None else blocks


def _tokenized_stdlib(data_args: DataArguments, tokenizer: Any, block_size: int) -> tuple[Any, Any]:
    """The stdlib corpus through the model's tokenizer; reads only as many files as the blocks need."""
    from datasets import Dataset

    from .data import is_eval_file, stdlib_source_files

    wanted = {"train": data_args.max_train_samples or 4096, "eval": data_args.max_eval_samples or 256}
    ids: dict[str, list[int]] = {"train": [], "eval": []}
    for path in stdlib_source_files():
        split = "eval" if is_eval_file(path, 10) else "train"
        if len(ids[split]) >= wanted[split] * block_size:
            if all(len(ids[s]) >= wanted[s] * block_size for s in ids):
                break
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        ids[split].extend(_encode(tokenizer, [text])[0])
    out = []
    for split in ("train", "eval"):
        blocks = _blocks_from_ids([ids[split]], block_size)[: wanted[split]]
        if not blocks:
            raise ValueError(f"the standard library gave no {split} block of {block_size} tokens")
        out.append(Dataset.from_dict({"input_ids": blocks, "labels": [list(b) for b in blocks]}))
    return out[0], out[1]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
