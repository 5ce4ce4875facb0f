"""One `RunSpec` trained and measured, in whatever process runs it (`executors.py`).

A spec that starts at a trunk checkpoint resumes through `resume_from_checkpoint` (model, optimizer,
scheduler, RNG, data position and engine continue exactly); the step counts run from step 0, as the
counters travel in the checkpoint. Only the end is evaluated.
"""

from __future__ import annotations

import dataclasses
import tempfile
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import DataLoader
from transformers import default_data_collator

from .methods import Method, TrialContext, parse_method
from .methods.selective_backprop import per_sample_loss
from .range_test import RangeRamp, suggested_rate
from .runner import LossTrace, StopAt, TrainingClock, measured, start
from .spec import RANGE_TEST, RunSpec
from .task import BenchTask


@dataclass
class Measured:
    """What a run measured, before the coordinator adds the trunk's cost up to its start."""

    stop: int
    eval_loss: float | None
    step_counts: dict[str, int]
    own_seconds: float
    wall_seconds: float
    clock: str
    losses: list[float] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    note: str | None = None
    trainable_bytes: int = 0
    engine_peak_bytes: int = 0
    device_peak_bytes: int | None = None
    eval_example_losses: list[float] | None = None
    eval_example_tokens: list[int] | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Measured:
        return cls(**data)


def run_spec(task: BenchTask, spec: RunSpec, method: Method | None = None) -> Measured:
    method = method or parse_method(spec.method)
    clock, trace = TrainingClock(method), LossTrace()
    callbacks: list[Any] = [clock, trace]
    if spec.saves:
        callbacks.append(StopAt(spec.stop, save=True))
    if spec.kind == RANGE_TEST:
        callbacks.append(RangeRamp(spec.steps))
    with tempfile.TemporaryDirectory() as tmp:
        ctx = TrialContext(
            task=task,
            learning_rate=spec.learning_rate,
            seed=spec.seed,
            steps=spec.steps,
            output_dir=spec.trunk_dir if spec.saves else tmp,
            callbacks=callbacks,
            replay=spec.replay,
            resume_from=spec.checkpoint,
            extra_args={**spec.schedule, "eval_strategy": "no", "logging_strategy": "no"},
        )
        trainer = start(method, ctx)
        trainer.train(resume_from_checkpoint=spec.checkpoint)
        examples, counts = evaluate_examples(trainer, task) if spec.evaluate else (None, None)
        eval_loss = weighted_mean(examples, counts) if spec.evaluate else None
    result = Measured(
        stop=trainer.state.global_step,
        eval_loss=eval_loss,
        own_seconds=clock.train_seconds(),
        losses=trace.losses,
        **measured(trainer, method, clock),
        eval_example_losses=[round(v, 5) for v in examples] if spec.per_example else None,
        eval_example_tokens=counts if spec.per_example else None,
    )
    if spec.kind == RANGE_TEST:  # its centre is kept: a record resumed under a later rule keeps it
        result.details["centre"] = suggested_rate(result.losses, spec.stop)
    return result


def evaluate_examples(trainer: Any, task: BenchTask) -> tuple[list[float], list[int]]:
    """Each eval example's mean loss and scored tokens, through the task's own collator for every method."""
    model = trainer.model
    model.eval()
    collate = task.data_collator or default_data_collator
    keys = ("input_ids", "attention_mask", "token_type_ids", "labels")
    columns = [c for c in task.evaluation.column_names if c in keys]
    loader = DataLoader(task.evaluation.select_columns(columns), task.eval_batch_size, collate_fn=collate)
    losses: list[float] = []
    counts: list[int] = []
    with torch.no_grad():
        for batch in loader:
            batch = {k: v.to(trainer.args.device) for k, v in batch.items()}
            logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
            mean, count = per_sample_loss(logits, batch["labels"], with_counts=True)
            losses.extend(mean.tolist())
            counts.extend(count.tolist())
    return losses, counts


def weighted_mean(losses: list[float], counts: list[int]) -> float:
    return sum(v * c for v, c in zip(losses, counts, strict=True)) / max(1, sum(counts))
