"""A user's own model and data as an arena task, every problem refused before anything trains.

`--dataset`: a CSV, JSON-lines or text file or a `save_to_disk` folder; eval: `--eval_dataset` or a held-out
`--eval_fraction` (seed 0). A causal LM's text is cut into blocks of `max_length` tokens (as `run_clm.py`)
or, with `--lm_examples rows` or a `--prompt_column`, is one example per row, padded per batch and priced
per token; string labels are numbered in sorted order. `--eval_group_column` names the eval rows that
move together (a file, a document): the eval noise is bootstrapped over those groups, not over rows.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from datasets import ClassLabel, DatasetDict, load_dataset, load_from_disk
from peft import LoraConfig, TaskType, get_peft_model
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorWithPadding,
)
from transformers.utils import logging as hf_logging

from ..data import DataError, group_into_blocks
from .methods.packing import IGNORE, PadToLongest, length_spread
from .task import TASK_TYPES, BenchTask

logger = logging.getLogger(__name__)

GROUP = "eval_group"  # the column that carries `--eval_group_column` through tokenizing, then leaves

FILE_BUILDERS = {".csv": "csv", ".json": "json", ".jsonl": "json", ".txt": "text"}
PEFT_CHOICES = ("none", "lora")
LM_EXAMPLES = ("blocks", "rows")


@dataclass(frozen=True)
class UserTaskOptions:
    model_name_or_path: str
    dataset: str
    task: str = "causal_lm"
    eval_dataset: str | None = None
    eval_fraction: float = 0.15
    text_column: str = "text"
    label_column: str = "label"
    peft: str = "none"
    lora_r: int = 8
    max_length: int = 128
    max_steps: int = 200
    per_device_train_batch_size: int = 8
    per_device_eval_batch_size: int = 32
    learning_rate: float | None = None
    max_train_samples: int | None = None
    max_eval_samples: int | None = None
    lm_examples: str = "blocks"  # causal_lm: text cut into blocks, or each row one example
    prompt_column: str | None = None  # causal_lm: each row a prompt (not scored) and its text
    eval_group_column: str | None = None  # the eval rows' document: the eval noise's clusters

    @property
    def rows(self) -> bool:
        """A causal LM whose every row is one example (of its own length)."""
        return self.task == "causal_lm" and (self.lm_examples == "rows" or self.prompt_column is not None)

    def check(self) -> None:
        """Refuse what cannot work, naming the flag, the value and what is allowed."""
        for name, choices in (("task", TASK_TYPES), ("peft", PEFT_CHOICES), ("lm_examples", LM_EXAMPLES)):
            if getattr(self, name) not in choices:
                raise DataError(f"`--{name}` must be one of {list(choices)}, got {getattr(self, name)!r}")
        if self.task != "causal_lm" and (self.prompt_column is not None or self.lm_examples != "blocks"):
            raise DataError("`--prompt_column` and `--lm_examples` are for `--task causal_lm`")
        if self.eval_group_column is not None and self.task == "causal_lm" and not self.rows:
            raise DataError(
                "`--eval_group_column` needs one example per row: `--task sequence_classification`, or "
                "`--lm_examples rows` or a `--prompt_column` (blocks run across rows)"
            )
        if not 0 < self.eval_fraction < 1:
            raise DataError(f"`--eval_fraction` must be in (0, 1), got {self.eval_fraction}")
        counts = ("max_length", "per_device_train_batch_size", "per_device_eval_batch_size", "lora_r")
        for name in (*counts, "max_train_samples", "max_eval_samples"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise DataError(f"`--{name}` must be >= 1, got {getattr(self, name)}")
        if self.learning_rate is not None and not self.learning_rate > 0:
            raise DataError(f"`--learning_rate` must be > 0, got {self.learning_rate}")
        check_model_path(self.model_name_or_path)
        for flag, path in (("--dataset", self.dataset), ("--eval_dataset", self.eval_dataset)):
            if path is not None:
                check_data_path(flag, path)


def check_model_path(name_or_path: str) -> None:
    """A local directory must hold a saved model; any other name, a Hub id that resolves."""
    path = Path(name_or_path).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise DataError(f"`--model_name_or_path` {name_or_path} has no config.json: not a saved model")
        return
    if name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1:
        raise DataError(f"`--model_name_or_path` {name_or_path} does not exist")

    try:
        AutoConfig.from_pretrained(name_or_path)
    except (OSError, ValueError) as exc:
        raise DataError(
            f"`--model_name_or_path` {name_or_path!r} is not a local directory and could not be loaded "
            f"from the Hub cache or the Hub ({type(exc).__name__}: {str(exc).splitlines()[0]})"
        ) from None


def check_data_path(flag: str, path: str) -> None:
    p = Path(path).expanduser()
    if not p.exists():
        raise DataError(f"`{flag}` {path} does not exist")
    if p.is_file() and p.suffix.lower() not in FILE_BUILDERS:
        raise DataError(
            f"`{flag}` {path}: a file must end in one of {sorted(FILE_BUILDERS)}, or be a folder written "
            "by `Dataset.save_to_disk`"
        )


def read_table(flag: str, path: str) -> tuple[Any, Any]:
    """(rows, rows of a ready-made eval split or None) of a file or a `save_to_disk` folder."""
    p = Path(path).expanduser()
    if p.is_dir():
        loaded = load_from_disk(str(p))
        if isinstance(loaded, DatasetDict):
            if "train" not in loaded:
                raise DataError(f"`{flag}` {path} has splits {sorted(loaded)} but no `train`")
            held_out = next((loaded[s] for s in ("validation", "test") if s in loaded), None)
            return loaded["train"], held_out
        return loaded, None
    builder = FILE_BUILDERS[p.suffix.lower()]
    if p.stat().st_size == 0:
        raise DataError(f"`{flag}` {path} is empty (0 rows)")
    try:
        return load_dataset(builder, data_files=str(p), split="train"), None
    except ValueError as exc:  # `datasets` on a file with a header and no rows
        if "corresponds to no data" in str(exc):
            raise DataError(f"`{flag}` {path} is empty (0 rows)") from None
        raise


def build_user_task(options: UserTaskOptions) -> BenchTask:
    """Load and check everything, tokenize once; the task builds a model per seed (label names in `info`)."""
    options.check()
    train_rows, eval_rows, ready_eval = _rows(options)
    tokenizer = AutoTokenizer.from_pretrained(options.model_name_or_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    info: dict[str, Any] = {
        "model_name_or_path": options.model_name_or_path,
        "dataset": options.dataset,
        "eval_dataset": options.eval_dataset
        or (f"{options.eval_fraction:g} held out" if ready_eval is None else "its validation split"),
        "text_column": options.text_column,
        "peft": options.peft,
        "max_length": options.max_length,
    }
    if options.task == "causal_lm":
        train, evaluation, collator = _causal_lm(train_rows, eval_rows, tokenizer, options, info)
        num_labels = None
    else:
        names = _label_names(train_rows, options.label_column)
        info.update(label_column=options.label_column, labels=names)
        train, evaluation = (
            _classification(rows, tokenizer, options, names, split)
            for rows, split in ((train_rows, "train"), (eval_rows, "eval"))
        )
        collator = DataCollatorWithPadding(tokenizer)
        num_labels = len(names)
    clusters = _groups(evaluation, options.eval_group_column)
    if clusters is not None:
        evaluation = evaluation.remove_columns(GROUP)
        info["eval_groups"] = len(set(clusters))
    return BenchTask(
        recipe={"user": dataclasses.asdict(options)},
        name=Path(options.dataset).stem or "user_task",
        task_type=options.task,
        build_model=lambda seed: load_model(options, seed, num_labels, tokenizer),
        train=train,
        evaluation=evaluation,
        learning_rate=options.learning_rate,
        max_steps=options.max_steps,
        batch_size=options.per_device_train_batch_size,
        eval_batch_size=options.per_device_eval_batch_size,
        data_collator=collator,
        info=info,
        eval_clusters=clusters,
    )


def _rows(options: UserTaskOptions) -> tuple[Any, Any, Any]:
    """(train rows, eval rows, the dataset's own eval split or None), each checked for its columns."""
    train_rows, ready_eval = read_table("--dataset", options.dataset)
    columns = {options.text_column: "--text_column"}
    if options.task != "causal_lm":
        columns[options.label_column] = "--label_column"
    if options.prompt_column is not None:
        columns[options.prompt_column] = "--prompt_column"
    if options.eval_group_column is not None and options.eval_dataset is None:
        columns[options.eval_group_column] = "--eval_group_column"
    _check_columns("--dataset", options.dataset, train_rows, columns)
    if options.eval_dataset is not None:
        eval_rows, _ = read_table("--eval_dataset", options.eval_dataset)
        group = {options.eval_group_column: "--eval_group_column"} if options.eval_group_column else {}
        _check_columns("--eval_dataset", options.eval_dataset, eval_rows, {**columns, **group})
    elif ready_eval is not None:
        eval_rows = ready_eval
    elif len(train_rows) < 2:
        raise DataError(f"`--dataset` {options.dataset} has {len(train_rows)} row(s): nothing to hold out")
    else:
        split = train_rows.train_test_split(test_size=options.eval_fraction, seed=0)
        train_rows, eval_rows = split["train"], split["test"]
    return (
        _take(train_rows, options.max_train_samples),
        _take(eval_rows, options.max_eval_samples),
        ready_eval,
    )


def load_model(options: UserTaskOptions, seed: int, num_labels: int | None, tokenizer: Any) -> Any:
    """A fresh model for `seed`: the pretrained weights, a new head and adapters drawn from the seed."""
    torch.manual_seed(seed)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # a new classification head is reported as MISSING: expected
    try:
        if options.task == "causal_lm":
            model = AutoModelForCausalLM.from_pretrained(options.model_name_or_path)
        else:
            # a saved classifier's head of another size is replaced, as run_glue.py does
            model = AutoModelForSequenceClassification.from_pretrained(
                options.model_name_or_path, num_labels=num_labels, ignore_mismatched_sizes=True
            )
            if model.config.pad_token_id is None:
                model.config.pad_token_id = tokenizer.pad_token_id
    finally:
        hf_logging.set_verbosity(verbosity)
    if options.peft == "lora":
        task_type = TaskType.CAUSAL_LM if options.task == "causal_lm" else TaskType.SEQ_CLS
        torch.manual_seed(seed)
        config = LoraConfig(task_type=task_type, r=options.lora_r, lora_alpha=2 * options.lora_r)
        model = get_peft_model(model, config)
    return model


def _check_columns(flag: str, path: str, rows: Any, columns: dict[str, str]) -> None:
    """`columns`: each column the task reads, and the flag that named it."""
    if len(rows) == 0:
        raise DataError(f"`{flag}` {path} is empty (0 rows)")
    for column, which in columns.items():
        if column not in rows.column_names:
            raise DataError(
                f"`{which}` {column!r} is not a column of {path}; its columns: {rows.column_names}"
            )


def _take(rows: Any, limit: int | None) -> Any:
    if limit is None or limit >= len(rows):
        return rows
    return rows.shuffle(seed=0).select(range(limit))


def _causal_lm(
    train_rows: Any, eval_rows: Any, tokenizer: Any, options: UserTaskOptions, info: dict[str, Any]
) -> tuple[Any, Any, Any]:
    """(train, eval, collator) of a causal LM: blocks of one length, or a row each padded per batch."""
    examples = _lm_rows if options.rows else _lm_blocks
    train, evaluation = (
        examples(r, tokenizer, options, name) for r, name in ((train_rows, "train"), (eval_rows, "eval"))
    )
    if not options.rows:
        return train, evaluation, None
    spread = length_spread([len(ids) for ids in train["input_ids"]], options.per_device_train_batch_size)
    info.update(lm_examples="rows", prompt_column=options.prompt_column, lengths=spread.quantiles)
    info["padding_share"] = round(spread.padding_share, 4)
    logger.info("hf_hybrid: %s", spread.describe())
    return train, evaluation, PadToLongest(pad_token_id=tokenizer.pad_token_id or 0)


def _lm_rows(rows: Any, tokenizer: Any, options: UserTaskOptions, split: str) -> Any:
    """Each row one example: prompt (labels -100), text and EOS, cut at `max_length`."""
    text, prompt, eos = options.text_column, options.prompt_column, tokenizer.eos_token_id
    group = options.eval_group_column if split == "eval" else None

    def encode(batch: dict[str, list[Any]]) -> dict[str, list[list[int]]]:
        bodies = [t if isinstance(t, str) else "" for t in batch[text]]
        texts = tokenizer(bodies, add_special_tokens=False)["input_ids"]
        prompts = (
            tokenizer([str(p) for p in batch[prompt]], add_special_tokens=False)["input_ids"]
            if prompt is not None
            else [[] for _ in texts]
        )
        out: dict[str, list[Any]] = {"input_ids": [], "labels": [], **({GROUP: []} if group else {})}
        for i, (head, body) in enumerate(zip(prompts, texts, strict=True)):
            ids = [*head, *body, *([eos] if eos is not None else [])][: options.max_length]
            if len(ids) > len(head) + (0 if head else 1):  # something to predict
                out["input_ids"].append(ids)
                out["labels"].append([IGNORE] * len(head) + ids[len(head) :])
                if group:
                    out[GROUP].append(str(batch[group][i]))
        return out

    examples = rows.map(encode, batched=True, batch_size=1000, remove_columns=rows.column_names)
    if len(examples) == 0:
        raise DataError(
            f"no {split} row of {options.dataset} has a `{text}` token within `--max_length` "
            f"{options.max_length}"
        )
    return examples


def _lm_blocks(rows: Any, tokenizer: Any, options: UserTaskOptions, split: str) -> Any:
    column = options.text_column

    def group(batch: dict[str, list[Any]]) -> dict[str, list[list[int]]]:
        texts = [t for t in batch[column] if isinstance(t, str) and t]
        ids = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
        blocks = group_into_blocks(ids, options.max_length)
        return {"input_ids": blocks, "labels": [list(b) for b in blocks]}

    blocks = rows.map(group, batched=True, batch_size=1000, remove_columns=rows.column_names)
    if len(blocks) == 0:
        raise DataError(
            f"the {split} text of {options.dataset} holds no full block of {options.max_length} tokens; "
            "use a smaller `--max_length` or more text"
        )
    return blocks


def _label_names(rows: Any, column: str) -> list[str]:
    feature = rows.features[column]
    # a ClassLabel keeps its own numbering; other labels are numbered in sorted order
    names = list(feature.names) if isinstance(feature, ClassLabel) else sorted({str(v) for v in rows[column]})
    if len(names) < 2:  # one label would make transformers build a regression head
        raise DataError(f"`--label_column` {column!r} has {len(names)} distinct label(s); need >= 2")
    return names


def _classification(rows: Any, tokenizer: Any, options: UserTaskOptions, names: list[str], split: str) -> Any:
    column, text = options.label_column, options.text_column
    feature = rows.features[column]
    # a label is read by its name: two ClassLabels may number the same names differently
    name_of = feature.int2str if isinstance(feature, ClassLabel) else str
    index = {name: i for i, name in enumerate(names)}
    unseen = sorted({name_of(v) for v in rows[column]} - set(index))
    if unseen:
        raise DataError(f"labels {unseen} of the {split} split are not in the training labels {names}")

    group = options.eval_group_column if split == "eval" else None

    def encode(batch: dict[str, list[Any]]) -> dict[str, Any]:
        encoded = tokenizer([str(t) for t in batch[text]], truncation=True, max_length=options.max_length)
        encoded["labels"] = [index[name_of(v)] for v in batch[column]]
        if group:
            encoded[GROUP] = [str(v) for v in batch[group]]
        return encoded

    return rows.map(encode, batched=True, remove_columns=rows.column_names)


def _groups(evaluation: Any, column: str | None) -> list[int] | None:
    """Each eval example's group as a number (in order of first appearance); None (each example its own
    cluster) without `--eval_group_column`."""
    if column is None:
        return None
    numbers: dict[str, int] = {}
    return [numbers.setdefault(value, len(numbers)) for value in evaluation[GROUP]]
