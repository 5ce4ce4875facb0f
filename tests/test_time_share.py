"""The share of the step time that `hybrid_stats()` reports covers what the hybrid trainer adds — its
hooks included, not only the engine's methods — and fits inside a process-time measurement of the same
run. Only CPU-time relations are asserted, never a speed."""

from __future__ import annotations

import time
from typing import Any

import pytest
from helpers import hybrid_trainer
from transformers import TrainerCallback


class _StepClock(TrainerCallback):
    """Process time of each optimizer step as the Trainer sees it (step begin to step end).

    It must be the first callback: the engine's own step clock starts in the hybrid trainer's
    `on_step_begin` (where the phase is decided) and stops in the optimizer step, so this span holds it
    whole only when it starts before that callback runs (it ends in `on_step_end`, after the optimizer
    step). Appended, it would start after the engine's clock and the two spans would not nest.
    """

    def __init__(self) -> None:
        self.seconds = 0.0
        self.began = 0.0

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.began = time.process_time()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.seconds += time.process_time() - self.began


def _burn(seconds: float) -> float:
    """Spend `seconds` of this process's CPU time; return what was spent, on the same clock."""
    start = time.process_time()
    while time.process_time() - start < seconds:
        pass
    return time.process_time() - start


class _SlowMetrics(TrainerCallback):
    """Makes the engine's metrics, which the trainer's `log` adds to every training log, cost CPU time:
    work done in a trainer-side hook, which the share must include."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.burnt: list[float] = []

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        engine = self.trainer.engine
        metrics = engine.metrics

        def slow_metrics() -> dict[str, float]:
            self.burnt.append(_burn(0.002))
            return metrics()

        engine.metrics = slow_metrics


def test_the_share_covers_the_trainer_hooks_and_fits_the_process_time(tmp_path):
    trainer = hybrid_trainer(tmp_path, max_steps=30)  # threshold 0: awake, predict phases open
    steps, slow = _StepClock(), _SlowMetrics(trainer)
    trainer.callback_handler.callbacks.insert(0, steps)  # before the hybrid trainer's: see _StepClock
    assert trainer.callback_handler.callbacks[0] is steps
    trainer.add_callback(slow)
    started = time.process_time()
    trainer.train()
    total = time.process_time() - started

    stats = trainer.hybrid_stats()
    timing, parts = stats["timing"], stats["timing"]["part_seconds"]
    assert stats["steps_per_phase"]["predict"] > 0 and stats["predict_checked"] > 0
    assert 0 < timing["engine_seconds"] <= total
    assert 0 < timing["step_seconds"] <= steps.seconds <= total
    assert len(slow.burnt) >= 30  # a training log per step (logging_steps=1)
    assert parts["trainer"] >= sum(slow.burnt) > 0
    assert parts["optimizer_wrapper"] > 0 and parts["decide"] > 0 and parts["score"] > 0
    assert timing["engine_seconds"] == pytest.approx(sum(parts.values()))
    assert timing["engine_time_share"] == pytest.approx(timing["engine_seconds"] / timing["step_seconds"])
    assert timing["parts"]["trainer"] == pytest.approx(parts["trainer"] / timing["step_seconds"])
