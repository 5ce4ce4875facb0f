"""What every training script shares around `Trainer.train()`: the arguments (a short `--help` that
imports no transformers), logging and the seed before any model is built (bit-identity with the plain
`Trainer` needs the model created after `set_seed`), and the end of run plus `hybrid_stats.json`.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import textwrap
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import MISSING, Field, dataclass, fields
from pathlib import Path
from typing import Any

from ..hybrid_arguments import HybridArgumentsMixin, help_field

logger = logging.getLogger(__name__)

ARGUMENT_FILE_SUFFIXES = (".json", ".yaml", ".yml")
HELP_FLAGS = ("-h", "--help")
HELP_ALL_FLAG = "--help-all"
USAGE = f"%(prog)s [--FIELD VALUE ...] | %(prog)s ARGS.json|ARGS.yaml   ({HELP_FLAGS[1]}, {HELP_ALL_FLAG})"
STATS_FILE = "hybrid_stats.json"
HELP_WIDTH = 100


@dataclass
class PretrainedModelArguments:
    """Which pretrained model to load, and how."""

    model_name_or_path: str | None = help_field(None, "Hub id or local directory of the model.")
    tokenizer_name: str | None = help_field(None, "Tokenizer hub id or directory, if not the model's own.")
    cache_dir: str | None = help_field(None, "Where downloaded models are cached.")
    revision: str = help_field("main", "Model revision (branch, tag or commit).")
    trust_remote_code: bool = help_field(
        False, "Allow model code from the Hub to run (only for repos you trust)."
    )

    def hub_kwargs(self) -> dict[str, Any]:
        """The `from_pretrained` keywords these arguments set (the model's and the tokenizer's)."""
        return {
            "cache_dir": self.cache_dir,
            "revision": self.revision,
            "trust_remote_code": self.trust_remote_code,
        }


@dataclass
class TextDataArguments:
    """Which text to train on: a built-in dataset, a local file or a Hub dataset."""

    dataset: str = help_field("", "A local .txt/.csv/.json/.jsonl file or a Hub dataset.")
    dataset_config_name: str | None = help_field(None, "Configuration name of a Hub dataset.")
    text_column: str = help_field("text", "Column holding the text (not for .txt).")
    max_train_samples: int | None = help_field(None, "Keep at most this many training examples.")
    max_eval_samples: int | None = help_field(None, "Keep at most this many evaluation examples.")
    validation_split_percentage: int = help_field(
        5, "Percentage of the training split held out for evaluation when there is no validation split."
    )

    def __post_init__(self) -> None:
        for name in ("max_train_samples", "max_eval_samples"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"`{name}` must be >= 1, got {value}")
        if not 0 < self.validation_split_percentage < 100:
            raise ValueError(
                f"`validation_split_percentage` must be in (0, 100), got {self.validation_split_percentage}"
            )


# ---- arguments -----------------------------------------------------------------------------------


def parse_arguments(
    script_types: Sequence[type],
    argv: Sequence[str] | None = None,
    *,
    defaults: dict[str, Any] | None = None,
    prog: str | None = None,
    training_arguments: type | None = None,
    epilog: str = "",
) -> tuple[Any, ...]:
    """The script's dataclasses and the training arguments (last), from flags or one .json/.yaml file;
    `defaults` replace the dataclasses' own. Invalid values exit with one usage line, before any model."""
    argv = list(sys.argv[1:] if argv is None else argv)
    defaults = dict(defaults or {})
    training_name = "TrainingArguments" if training_arguments is None else training_arguments.__name__
    if any(flag in argv for flag in HELP_FLAGS):
        print(grouped_help(script_types, defaults, prog, training_name, epilog))
        raise SystemExit(0)
    from transformers import HfArgumentParser

    if training_arguments is None:
        from ..args import HybridTrainingArguments

        training_arguments = HybridTrainingArguments
    parser = HfArgumentParser((*script_types, training_arguments), prog=prog, usage=USAGE)
    parser.set_defaults(**defaults)
    if HELP_ALL_FLAG in argv:
        parser.print_help()
        raise SystemExit(0)
    try:
        if len(argv) == 1 and argv[0].endswith(ARGUMENT_FILE_SUFFIXES) and not argv[0].startswith("-"):
            return parser.parse_dict({**defaults, **read_argument_file(Path(argv[0]))})
        return parser.parse_args_into_dataclasses(args=argv, look_for_args_file=False)
    except ValueError as exc:  # __post_init__ validation or unknown keys
        parser.error(str(exc))
        raise  # pragma: no cover - parser.error exits


def read_argument_file(path: Path) -> dict[str, Any]:
    """A mapping of argument names to values from a .json or .yaml file."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        values = json.loads(text)
    else:
        import yaml

        values = yaml.safe_load(text)
    if not isinstance(values, dict):
        raise ValueError(f"argument file {path} must hold a mapping of argument names to values")
    return values


def grouped_help(
    script_types: Sequence[type],
    defaults: dict[str, Any],
    prog: str | None,
    training_name: str,
    epilog: str = "",
) -> str:
    """The short `--help`: the `hybrid_*` fields, then each script dataclass, then where the rest is; from
    the dataclass fields alone, importing no transformers (HfArgumentParser's help takes seconds)."""
    parser = argparse.ArgumentParser(
        prog=prog, usage=USAGE, add_help=False, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(*HELP_FLAGS, action="store_true", help="this list")
    parser.add_argument(HELP_ALL_FLAG, action="store_true", help=f"every flag, {training_name}'s included")
    listed: set[str] = set()
    for cls in (HybridArgumentsMixin, *script_types):
        group = parser.add_argument_group(cls.__name__, _summary(cls))
        for item in fields(cls):
            listed.add(item.name)
            group.add_argument(
                f"--{item.name}", metavar=_metavar(cls, item), help=_field_help(item, defaults)
            )
    others = ", ".join(f"{k}={v}" for k, v in defaults.items() if k not in listed)
    paragraphs = [
        f"Every {training_name} field is a flag too (--output_dir, --max_steps, --learning_rate, "
        f"--per_device_train_batch_size, --resume_from_checkpoint, ...): `{parser.prog} {HELP_ALL_FLAG}` "
        "lists them all. Instead of flags, one .json or .yaml file may hold every argument.",
        f"This script's own defaults for them: {others}." if others else "",
    ]
    parser.epilog = "\n\n".join(
        [*(textwrap.fill(text, HELP_WIDTH) for text in paragraphs if text), *([epilog] if epilog else [])]
    )
    return parser.format_help()


def _summary(cls: type) -> str:
    return (cls.__doc__ or "").strip().split("\n")[0]


def _metavar(cls: type, item: Field) -> str:
    """`{a,b}` for a field with choices, else its type: INT, FLOAT, BOOL, STR, JSON, `STR [...]`."""
    choices = item.metadata.get("choices")
    if choices:
        return "{" + ",".join(map(str, choices)) + "}"
    return _type_metavar(typing.get_type_hints(cls)[item.name])


def _type_metavar(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        names = [_type_metavar(arg) for arg in typing.get_args(hint) if arg is not type(None)]
        return "|".join(dict.fromkeys(names))
    if origin in (list, tuple):
        return f"{_type_metavar(typing.get_args(hint)[0])} [...]"
    if hint is dict or origin is dict:
        return "JSON"
    return {bool: "BOOL", int: "INT", float: "FLOAT", str: "STR"}.get(hint, str(hint).upper())


def _field_help(item: Field, defaults: dict[str, Any]) -> str:
    """The field's help, with its default (this script's, if it sets one) unless that is None."""
    if item.name in defaults:
        default = defaults[item.name]
    elif item.default is not MISSING:
        default = item.default
    elif item.default_factory is not MISSING:
        default = item.default_factory()
    else:
        default = None
    text = item.metadata.get("help", "")
    if default is not None:
        text += f" (default: {' '.join(map(str, default)) if isinstance(default, list) else default})"
    return text.replace("%", "%%")


def resume_target(value: str | bool | None) -> str | bool | None:
    """`--resume_from_checkpoint` arrives as a string: "True" is the newest checkpoint, "False" none."""
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return True if value.lower() == "true" else None
    return value


# ---- the run -------------------------------------------------------------------------------------


def setup_run(training_args: Any) -> None:
    """Log at the process's level (transformers' too), then seed everything before a model is built."""
    import transformers

    level = training_args.get_process_log_level()
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=level)
    transformers.utils.logging.set_verbosity(level)
    transformers.set_seed(training_args.seed)


def run_recipe(
    argv: Sequence[str] | None,
    script_types: tuple[type, type],
    build_trainer: Callable[[Any, Any, Any], Any],
    card_kwargs: Callable[[Any, Any], dict[str, Any]],
    *,
    perplexity: bool = False,
    **options: Any,
) -> dict[str, Any]:
    """A recipe's `main`: arguments, logging and seed, `build_trainer`'s trainer, training, `finish()`."""
    model_args, data_args, training_args = parse_arguments(script_types, argv, **options)
    setup_run(training_args)
    trainer = build_trainer(model_args, data_args, training_args)
    return train_and_finish(trainer, card_kwargs(model_args, data_args), perplexity=perplexity)


def train_and_finish(trainer: Any, card: dict[str, Any], *, perplexity: bool = False) -> dict[str, Any]:
    """`trainer.train()`, resuming where `--resume_from_checkpoint` says, then `finish()`."""
    result = trainer.train(resume_from_checkpoint=resume_target(trainer.args.resume_from_checkpoint))
    return finish(trainer, result, card, perplexity=perplexity)


def finish(
    trainer: Any, train_result: Any, card: dict[str, Any], *, perplexity: bool = False
) -> dict[str, Any]:
    """The end of a run as transformers' example scripts end (model, metrics, state, evaluation, model
    card), plus `hybrid_stats.json`, also printed on one line. Returns {"train", "eval", "hybrid"}."""
    trainer.save_model()
    train_metrics = {**train_result.metrics, "train_samples": len(trainer.train_dataset)}
    trainer.log_metrics("train", train_metrics)
    trainer.save_metrics("train", train_metrics)
    trainer.save_state()
    eval_metrics: dict[str, float] = {}
    if trainer.eval_dataset is not None:
        eval_metrics = trainer.evaluate()
        eval_metrics["eval_samples"] = len(trainer.eval_dataset)
        if perplexity:
            eval_metrics["perplexity"] = _perplexity(eval_metrics["eval_loss"])
        trainer.log_metrics("eval", eval_metrics)
        trainer.save_metrics("eval", eval_metrics)
    if trainer.args.push_to_hub:
        trainer.push_to_hub(**card)
    else:
        trainer.create_model_card(**card)
    stats = trainer.hybrid_stats()
    if trainer.is_world_process_zero():
        output_dir = Path(trainer.args.output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        (output_dir / STATS_FILE).write_text(json.dumps(stats, indent=2) + "\n")
        print(json.dumps({"hybrid_stats": stats}, sort_keys=True))
    return {"train": train_metrics, "eval": eval_metrics, "hybrid": stats}


def _perplexity(loss: float) -> float:
    try:
        return math.exp(loss)
    except OverflowError:
        return math.inf
