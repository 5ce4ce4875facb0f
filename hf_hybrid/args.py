"""HybridTrainingArguments: `TrainingArguments` plus the `hybrid_*` fields of `HybridArgumentsMixin`."""

from __future__ import annotations

from dataclasses import dataclass

from transformers import TrainingArguments

from .hybrid_arguments import HybridArgumentsMixin

__all__ = ["HybridArgumentsMixin", "HybridTrainingArguments", "upcast_training_args"]


@dataclass
class HybridTrainingArguments(HybridArgumentsMixin, TrainingArguments):
    """`TrainingArguments` with the hybrid fields; parseable by `HfArgumentParser`."""


def upcast_training_args(args: TrainingArguments | None) -> TrainingArguments:
    """Upcast a plain `TrainingArguments` to `HybridTrainingArguments` with hybrid defaults (as TRL does)."""
    if args is None:
        return HybridTrainingArguments(output_dir="trainer_output")
    if isinstance(args, HybridArgumentsMixin):
        return args
    values = args.to_dict()
    values["hub_token"] = args.hub_token  # to_dict() masks tokens
    return HybridTrainingArguments(**values)
