"""One run: a task, a method, a learning rate, a seed and a step budget, trained and measured.

Training time excludes evaluation. On CPU it is the process's CPU time (other processes on a shared
machine stretch wall-clock, barely CPU time), on CUDA wall-clock after a synchronize; wall-clock is kept
too. The compute is kept as counts of kinds of step (`Method.step_counts`), priced by the calibration.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import Trainer, TrainerCallback
from transformers.trainer_callback import PrinterCallback, ProgressCallback
from transformers.utils import logging as hf_logging

from .methods import Method, TrialContext
from .task import BenchTask


@dataclass
class RunResult:
    method: str
    learning_rate: float
    seed: int
    steps: int
    train_seconds: float  # CPU time of the process on CPU, wall-clock on CUDA; evaluation excluded
    wall_seconds: float
    clock: str
    eval_loss: float
    step_counts: dict[str, int]
    curve: list[dict[str, Any]] = field(default_factory=list)  # per evaluation: step, seconds, counts, loss
    stats: dict[str, Any] = field(default_factory=dict)  # hybrid_stats() of a hybrid run
    details: dict[str, Any] = field(default_factory=dict)  # what the method says about the run
    note: str | None = None
    trainable_bytes: int = 0
    engine_peak_bytes: int = 0  # the hybrid engine's largest state after any step
    device_peak_bytes: int | None = None  # torch.cuda.max_memory_allocated over the run (None on CPU)


class _Timer(TrainerCallback):
    """The run's clock: CPU time on CPU, wall-clock after a synchronize on CUDA."""

    def __init__(self) -> None:
        self.cuda = torch.cuda.is_available()
        self.clock = time.perf_counter if self.cuda else time.process_time

    def _time(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return self.clock()


class TrainingClock(_Timer):
    """Training time without evaluation or saving, and the eval loss (and step counts) against it."""

    def __init__(self, method: Method | None = None) -> None:
        super().__init__()
        self.method = method
        self.start = self.wall_start = 0.0
        self.paused = self.paused_wall = 0.0  # evaluating and saving
        self.paused_before_step = self.paused_wall_before_step = 0.0
        self.last_step_end = self.last_step_end_wall = 0.0
        self.mark = self.mark_wall = 0.0  # the end of the last step or pause
        self.trainer: Trainer | None = None
        self.curve: list[dict[str, Any]] = []
        self.engine_peak_bytes = 0

    def _now(self) -> tuple[float, float]:
        return self._time(), time.perf_counter()

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.start, self.wall_start = self._now()
        self.last_step_end, self.last_step_end_wall = self.start, self.wall_start
        self.mark, self.mark_wall = self.start, self.wall_start

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.last_step_end, self.last_step_end_wall = self._now()
        self.mark, self.mark_wall = self.last_step_end, self.last_step_end_wall
        # pauses finished before this step end: one that follows the last step is not training time
        self.paused_before_step, self.paused_wall_before_step = self.paused, self.paused_wall
        engine = getattr(self.trainer, "engine", None)
        if engine is not None:
            self.engine_peak_bytes = max(self.engine_peak_bytes, sum(engine.meter.peak.values()))

    def _pause(self) -> None:
        now, now_wall = self._now()
        self.paused += now - self.mark
        self.paused_wall += now_wall - self.mark_wall
        self.mark, self.mark_wall = now, now_wall

    def on_evaluate(
        self, args: Any, state: Any, control: Any, metrics: dict | None = None, **kwargs: Any
    ) -> None:
        trained, wall = self.train_seconds(), self.wall_seconds()
        self._pause()
        counts = self.method.step_counts(self.trainer, state.global_step) if self.method else {}
        self.curve.append(
            {
                "step": state.global_step,
                "seconds": trained,
                "wall_seconds": wall,
                "counts": counts,
                "eval_loss": float((metrics or {}).get("eval_loss", float("nan"))),
            }
        )

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._pause()

    def train_seconds(self) -> float:
        return self.last_step_end - self.start - self.paused_before_step

    def wall_seconds(self) -> float:
        return self.last_step_end_wall - self.wall_start - self.paused_wall_before_step


class LossTrace(TrainerCallback):
    """The loss `training_step` returns, every optimizer step (the mean over its micro-batches)."""

    def __init__(self) -> None:
        self.trainer: Trainer | None = None
        self.losses: list[float] = []
        self._step_losses: list[float] = []

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        trainer, original = self.trainer, self.trainer.training_step

        def training_step(model: Any, inputs: Any, num_items_in_batch: Any = None) -> torch.Tensor:
            loss = original(model, inputs, num_items_in_batch)
            self._step_losses.append(float(loss.detach()) * trainer.current_gradient_accumulation_steps)
            return loss

        trainer.training_step = training_step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._step_losses:
            self.losses.append(round(sum(self._step_losses) / len(self._step_losses), 6))
        self._step_losses = []


class StopAt(TrainerCallback):
    """Ends a trunk segment at `stop`, saving the checkpoint its continuation and branch resume from."""

    def __init__(self, stop: int, save: bool) -> None:
        self.stop, self.save = stop, save

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step >= self.stop:
            control.should_training_stop = True
            control.should_save = self.save


class StepTimer(_Timer):
    """Each optimizer step's time and tokens (0 where not counted): what calibration prices."""

    def __init__(self) -> None:
        super().__init__()
        self.began = 0.0
        self.tokens_before = 0
        self.seconds: list[float] = []
        self.tokens: list[int] = []

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.tokens_before = state.num_input_tokens_seen
        self.began = self._time()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.seconds.append(self._time() - self.began)
        self.tokens.append(int(state.num_input_tokens_seen - self.tokens_before))


def quiet_libraries() -> None:
    """One torch thread (the arena's clock assumes it) and no library chatter between its own lines."""
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    # torch.compile's workers are other processes, whose CPU time a run's clock would not see
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()  # "Loading weights" bars at every run's from_pretrained
    logging.getLogger("hf_hybrid").setLevel(logging.ERROR)


def quiet(trainer: Trainer) -> Trainer:
    """No console output from a run: the arena prints its own progress."""
    for callback in list(trainer.callback_handler.callbacks):
        if isinstance(callback, (PrinterCallback, ProgressCallback)):
            trainer.remove_callback(callback)
    return trainer


def run_trial(
    task: BenchTask,
    method: Method,
    *,
    learning_rate: float,
    seed: int,
    steps: int,
    eval_points: int = 4,
    replay: Sequence[str] | None = None,
    callbacks: Sequence[TrainerCallback] = (),
    output_dir: str | None = None,
) -> RunResult:
    """Train once and measure; `callbacks` with a `trainer` attribute get the trainer before training."""
    clock = TrainingClock(method)
    with tempfile.TemporaryDirectory() as tmp:
        ctx = TrialContext(
            task=task,
            learning_rate=learning_rate,
            seed=seed,
            steps=steps,
            output_dir=output_dir or tmp,
            eval_points=eval_points,
            callbacks=[clock, *callbacks],
            replay=replay,
        )
        trainer = start(method, ctx)
        trainer.train()
        if not clock.curve or clock.curve[-1]["step"] != trainer.state.global_step:
            trainer.evaluate()  # the final eval loss is what every method is judged by
    return RunResult(
        method=method.spec,
        learning_rate=learning_rate,
        seed=seed,
        steps=trainer.state.global_step,
        train_seconds=clock.train_seconds(),
        eval_loss=clock.curve[-1]["eval_loss"],
        curve=clock.curve,
        stats=trainer.hybrid_stats() if getattr(trainer, "engine", None) is not None else {},
        **measured(trainer, method, clock),
    )


def start(method: Method, ctx: TrialContext) -> Trainer:
    """The method's trainer, quiet, given to the callbacks that have a `trainer`; the device peak reset."""
    trainer = quiet(method.build(ctx))
    for callback in ctx.callbacks:
        if hasattr(callback, "trainer"):
            callback.trainer = trainer
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    return trainer


def measured(trainer: Trainer, method: Method, clock: TrainingClock) -> dict[str, Any]:
    """What every finished run records besides its steps, eval loss and training time."""
    trainable = [p for p in trainer.model.parameters() if p.requires_grad]
    return {
        "wall_seconds": clock.wall_seconds(),
        "clock": "wall" if clock.cuda else "cpu_time",
        "step_counts": method.step_counts(trainer, trainer.state.global_step),
        "details": method.describe_run(trainer),
        "note": method.note(trainer),
        "trainable_bytes": sum(p.numel() * p.element_size() for p in trainable),
        "engine_peak_bytes": clock.engine_peak_bytes,
        "device_peak_bytes": torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None,
    }
