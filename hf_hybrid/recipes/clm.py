"""Causal-LM training with HybridHFTrainer: `hf-hybrid train` and `examples/run_clm_hybrid.py`.

In the style of transformers' `run_clm.py`: a Hub or local causal LM, or the built-in byte-level GPT-2
from scratch, on `stdlib`, a local file or a Hub dataset cut into blocks of `--block_size` tokens.

    hf-hybrid train --output_dir out --max_steps 200
    hf-hybrid train --model_name_or_path gpt2 --dataset corpus.txt --output_dir out --hybrid_warmup_steps 50
    hf-hybrid train args.yaml
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..data import DataError, card_dataset_name, lm_datasets
from ..hybrid_arguments import help_field
from .common import PretrainedModelArguments, TextDataArguments, run_recipe

logger = logging.getLogger(__name__)

SUPPORTS = "causal LMs (AutoModelForCausalLM: GPT-2, Llama, Qwen, ...) or the built-in byte-level GPT-2"
BUILTIN_MODEL_CONFIGS = ("tiny",)
MAX_DEFAULT_BLOCK_SIZE = 1024


@dataclass
class ModelArguments(PretrainedModelArguments):
    """The causal LM: a pretrained one, or the built-in model from scratch."""

    model_name_or_path: str | None = help_field(
        None,
        "Hub id or local directory of a causal LM (AutoModelForCausalLM + AutoTokenizer). "
        "Leave empty to train the built-in `--model_config` from scratch.",
    )
    model_config: str | None = help_field(
        None,
        "Built-in model trained from scratch when no `--model_name_or_path` is given: `tiny` is "
        "a byte-level GPT-2 (2 layers x 64, vocabulary 256, 128 positions, no tokenizer).",
        choices=list(BUILTIN_MODEL_CONFIGS),
    )

    def __post_init__(self) -> None:
        if self.model_name_or_path is not None and self.model_config is not None:
            raise ValueError("pass either `--model_name_or_path` or `--model_config`, not both")
        if self.model_name_or_path is None and self.tokenizer_name is not None:
            raise ValueError(
                "`--tokenizer_name` needs `--model_name_or_path`; the built-in model is byte-level"
            )


@dataclass
class DataArguments(TextDataArguments):
    """The text, cut into blocks of `block_size` tokens."""

    dataset: str = help_field(
        "stdlib",
        "`stdlib` (built-in: the Python standard library's source, offline), a local "
        ".txt/.csv/.json/.jsonl file, or a Hub dataset name (datasets.load_dataset).",
    )
    max_train_samples: int | None = help_field(
        None, "Keep at most this many training blocks (stdlib default: 4096)."
    )
    max_eval_samples: int | None = help_field(
        None, "Keep at most this many evaluation blocks (stdlib default: 256)."
    )
    block_size: int | None = help_field(
        None, "Tokens per training block (default: the model's context, at most 1024; 128 for `tiny`)."
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.block_size is not None and self.block_size < 1:
            raise ValueError(f"`block_size` must be >= 1, got {self.block_size}")


def main(argv: Sequence[str] | None = None, **options: Any) -> dict[str, Any]:
    """Parse, train, finish; `options` are `parse_arguments`' `defaults`, `prog` and `epilog`."""
    return run_recipe(
        argv, (ModelArguments, DataArguments), build_trainer, card_kwargs, perplexity=True, **options
    )


def build_trainer(model_args: ModelArguments, data_args: DataArguments, training_args: Any) -> Any:
    """The model, its tokenizer and the blocks, in a HybridHFTrainer."""
    from transformers import default_data_collator

    from ..trainer import HybridHFTrainer

    model, tokenizer = load_model_and_tokenizer(model_args)
    block_size = resolve_block_size(data_args, model)
    train_dataset, eval_dataset = lm_datasets(
        data_args.dataset,
        tokenizer,
        block_size,
        config_name=data_args.dataset_config_name,
        text_column=data_args.text_column,
        max_train=data_args.max_train_samples,
        max_eval=data_args.max_eval_samples,
        validation_split_percentage=data_args.validation_split_percentage,
    )
    logger.info(
        "train blocks: %d, eval blocks: %d, block size %d", len(train_dataset), len(eval_dataset), block_size
    )
    return HybridHFTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,  # saved with the model
        data_collator=default_data_collator,
    )


def load_model_and_tokenizer(model_args: ModelArguments) -> tuple[Any, Any]:
    """A pretrained causal LM and its tokenizer, or the built-in byte-level model and no tokenizer."""
    if model_args.model_name_or_path is None:
        from transformers import GPT2LMHeadModel

        from ..tiny_models import tiny_gpt2_config

        name = model_args.model_config or BUILTIN_MODEL_CONFIGS[0]
        logger.info("training the built-in %r model from scratch (byte-level, no tokenizer)", name)
        return GPT2LMHeadModel(tiny_gpt2_config()), None
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hub = model_args.hub_kwargs()
    tokenizer = AutoTokenizer.from_pretrained(
        model_args.tokenizer_name or model_args.model_name_or_path, **hub
    )
    return AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path, **hub), tokenizer


def resolve_block_size(data_args: DataArguments, model: Any) -> int:
    """`--block_size`, or the model's context (at most 1024); longer than the context is refused."""
    limit = next(
        (
            value
            for name in ("n_positions", "max_position_embeddings", "n_ctx", "seq_length")
            if isinstance(value := getattr(model.config, name, None), int) and value > 0
        ),
        None,
    )
    if data_args.block_size is None:
        return min(limit or MAX_DEFAULT_BLOCK_SIZE, MAX_DEFAULT_BLOCK_SIZE)
    if limit is not None and data_args.block_size > limit:
        raise DataError(f"`block_size` {data_args.block_size} is longer than the model's context ({limit})")
    return data_args.block_size


def card_kwargs(model_args: ModelArguments, data_args: DataArguments) -> dict[str, Any]:
    """Model-card fields: the base model whenever one was loaded (transformers names only Hub ids) and the
    dataset by name."""
    card: dict[str, Any] = {"tasks": "text-generation", "dataset": card_dataset_name(data_args.dataset)}
    if model_args.model_name_or_path is not None:
        card["finetuned_from"] = model_args.model_name_or_path
    return card
