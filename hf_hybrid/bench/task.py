"""What the arena trains: a model and its data, a task type and a budget.

A `BenchTask` builds a fresh model for a seed (the same initialisation for every method at that seed)
and holds the train and eval sets, built once. The built-in tasks (`tasks.py`) are presets of it; a
user's own model and data become one through `user_task.py`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

TASK_TYPES = ("causal_lm", "sequence_classification")


@dataclass
class BenchTask:
    """One task. `build_model(seed)` returns a fresh model; `train`/`evaluation` are the datasets.

    `info` is what the record says about the task (model, data, columns, labels); `identity` is what makes
    two invocations the same task for resuming (the record refuses to mix tasks). `eval_clusters` says
    which eval examples come from one document: their losses move together, so the judge's eval noise
    is bootstrapped over documents, not examples."""

    name: str
    task_type: str
    build_model: Callable[[int], Any]
    train: Any
    evaluation: Any
    learning_rate: float
    max_steps: int
    batch_size: int
    eval_batch_size: int = 32
    gradient_accumulation_steps: int = 1
    weight_decay: float = 0.0
    lr_scheduler_type: str = "linear"
    warmup_ratio: float = 0.0
    data_collator: Any = None
    training_overrides: Mapping[str, Any] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    recipe: dict[str, Any] | None = None  # how a worker process builds it again (`recipe.py`)
    eval_clusters: list[int] | None = None  # per eval example: its document (None: each its own)

    def __post_init__(self) -> None:
        if self.task_type not in TASK_TYPES:
            raise ValueError(f"`task` must be one of {list(TASK_TYPES)}, got {self.task_type!r}")

    def build(self, seed: int) -> tuple[Any, Any, Any]:
        """A fresh model for `seed`, and the (shared) train and eval sets."""
        return self.build_model(seed), self.train, self.evaluation

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "task_type": self.task_type,
            "learning_rate": self.learning_rate,
            "max_steps": self.max_steps,
            "per_device_train_batch_size": self.batch_size,
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
            "weight_decay": self.weight_decay,
            "lr_scheduler_type": self.lr_scheduler_type,
            "train_examples": len(self.train),
            "eval_examples": len(self.evaluation),
            **self.info,
        }

    def identity(self) -> str:
        """A hash of everything that changes what a run of this task measures."""
        described = self.describe()
        described["train_fingerprint"] = getattr(self.train, "_fingerprint", None)
        described["eval_fingerprint"] = getattr(self.evaluation, "_fingerprint", None)
        return hashlib.sha256(json.dumps(described, sort_keys=True, default=str).encode()).hexdigest()[:16]
