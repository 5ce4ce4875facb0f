"""Padding, not computed: `packing`, `packing-naive`, `group_by_length`, and the per-batch padding they beat.

Plain pads each batch to its longest example (`PadToLongest`); the three methods train the same examples
per step and lay a batch out otherwise: `packing` end to end with `position_ids` restarting and no
attention across examples (checked on the model first: `check_model`), `packing-naive` cut into rows that
attend across examples, `group_by_length` the Trainer's length-grouped sampler. All are evaluated with the
task's own collator; on examples of one length they decline (`nothing_to_gain`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from transformers import DataCollatorWithFlattening, Trainer, TrainingArguments, default_data_collator

from .base import Method, MethodError, TrialContext

if TYPE_CHECKING:
    from ..task import BenchTask

IGNORE = -100
NOTHING_TO_GAIN = 0.01  # padding share of plain's batches below which packing cannot pay


@dataclass
class PadToLongest:
    """Each batch padded on the right to its longest example (labels -100); priced per token."""

    pad_token_id: int
    prices_tokens: ClassVar[bool] = True

    def __call__(self, features: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        longest = max(len(f["input_ids"]) for f in features)
        ids, mask, labels = [], [], []
        for feature in features:
            tokens = list(feature["input_ids"])
            pad = longest - len(tokens)
            ids.append(tokens + [self.pad_token_id] * pad)
            mask.append([1] * len(tokens) + [0] * pad)
            labels.append(list(feature.get("labels", tokens)) + [IGNORE] * pad)
        return _tensors(input_ids=ids, attention_mask=mask, labels=labels)


@dataclass
class ConcatenatedRows:
    """The batch's examples end to end, cut into rows of `row_length` tokens (`packing-naive`)."""

    row_length: int
    pad_token_id: int

    def __call__(self, features: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        ids = [t for f in features for t in f["input_ids"]]
        labels = [t for f in features for t in f.get("labels", f["input_ids"])]
        rows = max(1, -(-len(ids) // self.row_length))
        pad = rows * self.row_length - len(ids)
        mask = [1] * len(ids) + [0] * pad
        ids, labels = ids + [self.pad_token_id] * pad, labels + [IGNORE] * pad
        batch = _tensors(input_ids=ids, attention_mask=mask, labels=labels)
        return {key: value.view(rows, self.row_length) for key, value in batch.items()}


@dataclass
class PackedRows:
    """The batch's examples bin-packed into rows of `row_length`, `position_ids` restarting at each."""

    row_length: int
    pad_token_id: int

    def __call__(self, features: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        rows: list[list[dict[str, Any]]] = []
        room: list[int] = []
        for feature in sorted(features, key=lambda f: -len(f["input_ids"])):
            size = len(feature["input_ids"])
            index = next((i for i, free in enumerate(room) if free >= size), None)
            if index is None:
                rows.append([])
                room.append(self.row_length)
                index = len(rows) - 1
            rows[index].append(feature)
            room[index] -= size
        ids, labels, positions = [], [], []
        for row, free in zip(rows, room, strict=True):
            ids.append([t for f in row for t in f["input_ids"]] + [self.pad_token_id] * free)
            labels.append(
                [t for f in row for t in [IGNORE, *list(f.get("labels", f["input_ids"]))[1:]]]
                + [IGNORE] * free
            )
            positions.append([i for f in row for i in range(len(f["input_ids"]))] + list(range(free)))
        return _tensors(input_ids=ids, labels=labels, position_ids=positions)


def _tensors(**columns: list[Any]) -> dict[str, torch.Tensor]:
    return {key: torch.tensor(value) for key, value in columns.items()}


@dataclass(frozen=True)
class LengthSpread:
    """What padding costs plain on a training set (random batches, seed 0, as the Trainer draws them)."""

    examples: int
    quantiles: dict[str, int]  # tokens per example: the minimum, at 10, 25, 50, 75, 90, 99%, the maximum
    padding_share: float  # of the tokens plain's batches process, the share that is padding

    def describe(self) -> str:
        quantiles = ", ".join(f"{k} {v}" for k, v in self.quantiles.items())
        return f"tokens per example: {quantiles}; padding {self.padding_share:.0%} of plain's batch tokens"


def length_spread(lengths: Sequence[int], batch_size: int) -> LengthSpread:
    ordered = sorted(lengths)
    quantiles = {"min": ordered[0]}
    quantiles |= {
        f"p{q}": ordered[min(len(ordered) - 1, len(ordered) * q // 100)] for q in (10, 25, 50, 75, 90, 99)
    }
    quantiles["max"] = ordered[-1]
    shuffled = list(lengths)
    random.Random(0).shuffle(shuffled)
    real = padded = 0
    for start in range(0, len(shuffled), batch_size):
        batch = shuffled[start : start + batch_size]
        real += sum(batch)
        padded += max(batch) * len(batch)
    return LengthSpread(len(ordered), quantiles, 1.0 - real / padded if padded else 0.0)


def nothing_to_gain(task: BenchTask) -> str | None:
    """Why removing padding cannot pay on `task` (its examples have about one length), or None."""
    if task.task_type != "causal_lm":
        return f"packing needs a causal LM; the task is {task.task_type}"
    spread = length_spread([len(ids) for ids in task.train["input_ids"]], task.batch_size)
    if spread.padding_share >= NOTHING_TO_GAIN:
        return None
    blocks = "" if task.data_collator else " (text cut into blocks; `--lm_examples rows` keeps a row each)"
    return (
        f"nothing to gain from packing or length grouping: padding is {spread.padding_share:.1%} of plain's "
        f"batch tokens, the examples having {spread.quantiles['min']}-{spread.quantiles['max']} tokens"
        + blocks
    )


class _LayoutMethod(Method):
    """A plain Trainer with the batches laid out otherwise; evaluated with the task's own collator."""

    def declines(self, task: BenchTask) -> str | None:
        return nothing_to_gain(task)

    def collator(self, ctx: TrialContext) -> Any:
        return ctx.task.data_collator

    def arguments(self) -> dict[str, Any]:
        return {}

    def build(self, ctx: TrialContext) -> Trainer:
        model, train, evaluation = ctx.task.build(ctx.seed)
        kwargs = ctx.trainer_kwargs(model, train, evaluation)
        kwargs["data_collator"] = self.collator(ctx)
        args = ctx.training_arguments(**self.arguments())
        return TaskEvalTrainer(
            args=args, eval_collator=ctx.task.data_collator or default_data_collator, **kwargs
        )


class Packing(_LayoutMethod):
    name: ClassVar[str] = "packing"
    summary: ClassVar[str] = (
        "padding-free packing (DataCollatorWithFlattening): a batch's examples in one row, position_ids "
        "restarting, no attention across examples; the same examples per step as plain (packing:rows: "
        "bin-packed into rows of the task's maximum length, for attention that costs the row's square)"
    )
    option_help: ClassVar[dict[str, str]] = {
        "layout": "row (one flattened row per batch, the default) or rows (rows of the task's maximum length)"
    }
    positional: ClassVar[str | None] = "layout"

    def __post_init__(self) -> None:
        super().__post_init__()
        self.layout = self.option("layout", str, "row", lambda v: v in ("row", "rows"), "row or rows")

    @property
    def same_trajectory(self) -> bool:
        """The plain step's maths without its padding (the per-example losses agree to 1e-5)."""
        return True

    def collator(self, ctx: TrialContext) -> Any:
        if self.layout == "rows":
            return PackedRows(max_length(ctx.task), pad_token_id(ctx.task))
        return DataCollatorWithFlattening(return_position_ids=True, separator_id=IGNORE)

    def check_model(self, model: Any) -> None:
        leak = packed_attention_leak(model)
        if leak > 1e-4:
            raise MethodError(
                f"method {self.spec!r}: {type(model).__name__} attends across packed examples (an example's "
                f"logits move by {leak:.2g} when another is packed before it): its attention does not follow "
                "position_ids restarts; use an attention implementation that does (sdpa, flash_attention_2)"
            )


class NaivePacking(_LayoutMethod):
    name: ClassVar[str] = "packing-naive"
    summary: ClassVar[str] = (
        "a batch's examples concatenated and cut into rows of the task's maximum length, attending to each "
        "other (what many scripts do); the same examples per step as plain"
    )

    def collator(self, ctx: TrialContext) -> Any:
        return ConcatenatedRows(max_length(ctx.task), pad_token_id(ctx.task))


class GroupByLength(_LayoutMethod):
    name: ClassVar[str] = "group_by_length"
    summary: ClassVar[str] = (
        "the Trainer's length-grouped sampler (examples of similar length batched together)"
    )

    def arguments(self) -> dict[str, Any]:
        if "train_sampling_strategy" in TrainingArguments.__dataclass_fields__:
            return {"train_sampling_strategy": "group_by_length"}
        return {"group_by_length": True}  # transformers before the sampling strategy


def max_length(task: BenchTask) -> int:
    """The task's `max_length` or `seq_len`, else its longest training example."""
    length = task.info.get("max_length") or task.info.get("seq_len")
    return int(length or max(len(ids) for ids in task.train["input_ids"]))


def pad_token_id(task: BenchTask) -> int:
    return getattr(task.data_collator, "pad_token_id", 0) or 0


class TaskEvalTrainer(Trainer):
    """Trains with its own collator, evaluates with `eval_collator` (the task's)."""

    def __init__(self, *args: Any, eval_collator: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.eval_collator = eval_collator

    def get_eval_dataloader(self, eval_dataset: Any = None) -> Any:
        if self.eval_collator is None:
            return super().get_eval_dataloader(eval_dataset)
        train_collator, self.data_collator = self.data_collator, self.eval_collator
        try:
            return super().get_eval_dataloader(eval_dataset)
        finally:
            self.data_collator = train_collator


def packed_attention_leak(model: Any) -> float:
    """How far an example's logits move when another is packed before it (0: attention keeps them apart).
    Without a key-value cache, as the Trainer trains: transformers reads packing from `position_ids` only
    then."""
    vocab = int(getattr(model.config, "vocab_size", 2))
    first = torch.arange(1, 6) % vocab
    second = torch.arange(7, 13) % vocab
    row = torch.cat([first, second])[None]
    positions = torch.cat([torch.arange(len(first)), torch.arange(len(second))])[None]
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            alone = model(input_ids=second[None], use_cache=False).logits[0]
            packed = model(input_ids=row, position_ids=positions, use_cache=False).logits[0, len(first) :]
    finally:
        model.train(training)
    return float((packed - alone).abs().max() / alone.abs().max().clamp(min=1e-6))
