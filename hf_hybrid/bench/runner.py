"""One benchmark run: a task, a trainer kind, a learning rate, a step budget, a seed.

Training time excludes evaluation (both trainers evaluate at the same steps, and evaluation is not
what either of them speeds up). Compute is counted in forward-pass units: forward 1, backward 2, so
a real step costs 3 and a checked predicted step 1 (a blind one 0).
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_callback import PrinterCallback

from ..args import HybridTrainingArguments
from ..engine.accounting import FULL_STEP_COST
from ..engine.phases import Phase
from ..trainer import HybridHFTrainer
from .tasks import get_task

KINDS = ("plain", "hybrid", "null")


@dataclass(frozen=True)
class RunSpec:
    task: str
    size: str
    kind: str
    seed: int = 0
    lr_multiplier: float = 1.0
    budget: float = 1.0  # fraction of the task's step count
    eval_points: int = 4
    hybrid_overrides: tuple[tuple[str, Any], ...] = ()
    script: tuple[str, ...] | None = None  # phase sequence a `null` control replays

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"`kind` must be one of {KINDS}, got {self.kind!r}")
        if not 0 < self.budget <= 1:
            raise ValueError(f"`budget` must be in (0, 1], got {self.budget}")


@dataclass
class RunResult:
    spec: RunSpec
    steps: int
    learning_rate: float
    train_seconds: float  # CPU time of the process on CPU, wall-clock on CUDA; evaluation excluded
    compute_units: float
    eval_loss: float
    curve: list[dict[str, float]] = field(default_factory=list)  # per evaluation: step, seconds, units, loss
    stats: dict[str, Any] = field(default_factory=dict)
    phases: list[str] = field(default_factory=list)
    losses: list[float | None] = field(default_factory=list)
    wall_seconds: float = 0.0  # wall-clock, evaluation excluded
    clock: str = "cpu_time"
    trainable_bytes: int = 0
    engine_bytes: int = 0  # the engine's state at the end of the run
    engine_peak_bytes: int = 0  # its largest state after any step (a predict phase holds a snapshot)
    device_peak_bytes: int | None = None  # torch.cuda.max_memory_allocated over the run (None on CPU)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class _Clock(TrainerCallback):
    """Training time without evaluation, and the eval-loss curve against it.

    On CPU the clock is the process's CPU time: other processes on a shared machine stretch wall-clock
    by tens of percent but barely touch the CPU time a run spends (with one torch thread it equals the
    compute time). On CUDA it is wall-clock, after a synchronize. Wall-clock is kept alongside.
    """

    def __init__(self) -> None:
        self.cuda = torch.cuda.is_available()
        self.clock = time.perf_counter if self.cuda else time.process_time
        self.start = self.wall_start = 0.0
        self.eval_seconds = self.eval_wall_seconds = 0.0
        self.eval_before_step = self.eval_wall_before_step = 0.0
        self.last_step_end = self.last_step_end_wall = 0.0
        self.trainer: Trainer | None = None
        self.curve: list[dict[str, float]] = []
        self.engine_peak_bytes = 0

    def _now(self) -> tuple[float, float]:
        if self.cuda:
            torch.cuda.synchronize()
        return self.clock(), time.perf_counter()

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.start, self.wall_start = self._now()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.last_step_end, self.last_step_end_wall = self._now()
        # Evaluations finished before this step end: one that follows the last step is not training time
        # to subtract from it.
        self.eval_before_step, self.eval_wall_before_step = self.eval_seconds, self.eval_wall_seconds
        engine = getattr(self.trainer, "engine", None)
        if engine is not None:
            self.engine_peak_bytes = max(self.engine_peak_bytes, sum(engine.meter.peak.values()))

    def on_evaluate(
        self, args: Any, state: Any, control: Any, metrics: dict | None = None, **kwargs: Any
    ) -> None:
        trained = self.train_seconds()
        now, now_wall = self._now()
        self.eval_seconds += now - self.last_step_end
        self.eval_wall_seconds += now_wall - self.last_step_end_wall
        self.curve.append(
            {
                "step": state.global_step,
                "seconds": trained,
                "units": compute_units(self.trainer, state.global_step),
                "eval_loss": float((metrics or {}).get("eval_loss", float("nan"))),
            }
        )

    def train_seconds(self) -> float:
        return self.last_step_end - self.start - self.eval_before_step

    def wall_seconds(self) -> float:
        return self.last_step_end_wall - self.wall_start - self.eval_wall_before_step


def compute_units(trainer: Trainer | None, steps: int) -> float:
    """Forward-pass units spent so far: 3 per real step; the engine's own count for a hybrid run."""
    if isinstance(trainer, HybridHFTrainer) and trainer.engine is not None:
        return trainer.engine.compute_units()
    return steps * FULL_STEP_COST


def run(spec: RunSpec, output_dir: str | None = None, callbacks: Sequence[TrainerCallback] = ()) -> RunResult:
    """Train once and measure; every run in one benchmark goes through here, one after the other.

    Extra `callbacks` that have a `trainer` attribute get the trainer before training starts."""
    task = get_task(spec.task)
    size = task.size(spec.size)
    steps = max(1, round(size.steps * spec.budget))
    model, train, evaluation = task.build(size, spec.seed)
    lr = task.learning_rate * spec.lr_multiplier
    with tempfile.TemporaryDirectory() as tmp:
        args = _arguments(spec, output_dir or tmp, steps, size.batch_size, lr, task)
        clock = _Clock()
        trainer_cls = Trainer if spec.kind == "plain" else HybridHFTrainer
        extra = {"engine_config": _null_engine_config(args, spec)} if spec.kind == "null" else {}
        trainer = trainer_cls(
            model=model,
            args=args,
            train_dataset=train,
            eval_dataset=evaluation,
            callbacks=[clock, *callbacks],
            **extra,
        )
        for callback in trainer.callback_handler.callbacks:  # the report prints the numbers, not the logs
            if isinstance(callback, PrinterCallback):
                trainer.remove_callback(callback)
        for callback in (clock, *callbacks):
            if hasattr(callback, "trainer"):
                callback.trainer = trainer
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        trainer.train()
    trainable = [p for p in trainer.model.parameters() if p.requires_grad]
    hybrid = isinstance(trainer, HybridHFTrainer) and trainer.engine is not None
    timeline = trainer.hybrid_timeline if hybrid else []
    return RunResult(
        spec=spec,
        steps=steps,
        learning_rate=lr,
        train_seconds=clock.train_seconds(),
        wall_seconds=clock.wall_seconds(),
        clock="wall" if clock.cuda else "cpu_time",
        compute_units=compute_units(trainer, steps),
        eval_loss=clock.curve[-1]["eval_loss"] if clock.curve else float("nan"),
        curve=clock.curve,
        stats=trainer.hybrid_stats() if hybrid else {},
        phases=[row["phase"] for row in timeline] or [Phase.FULL.value] * steps,
        losses=[row["loss"] for row in timeline],
        trainable_bytes=sum(p.numel() * p.element_size() for p in trainable),
        engine_bytes=trainer.engine.nbytes() if hybrid else 0,
        engine_peak_bytes=clock.engine_peak_bytes,
        device_peak_bytes=torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None,
    )


def _arguments(
    spec: RunSpec, output_dir: str, steps: int, batch: int, lr: float, task: Any
) -> TrainingArguments:
    common: dict[str, Any] = {
        "output_dir": output_dir,
        "max_steps": steps,
        "per_device_train_batch_size": batch,
        "per_device_eval_batch_size": 64,
        "learning_rate": lr,
        "weight_decay": task.weight_decay,
        "eval_strategy": "steps",
        "eval_steps": max(1, steps // spec.eval_points),
        "logging_steps": max(1, steps // spec.eval_points),
        "save_strategy": "no",
        "report_to": "none",
        "seed": spec.seed,
        "data_seed": spec.seed,
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
        "use_cpu": not torch.cuda.is_available(),
    }
    if spec.kind == "plain":
        return TrainingArguments(**common)
    return HybridTrainingArguments(**common, **dict(spec.hybrid_overrides))


def _null_engine_config(args: HybridTrainingArguments, spec: RunSpec) -> Any:
    """The hybrid configuration with the null predictor, replaying the hybrid run's phases."""
    config = args.engine_config()
    script = None if spec.script is None else tuple(Phase(p) for p in spec.script)
    schedule = dataclasses.replace(config.schedule, script=script)
    return dataclasses.replace(config, predictor="null", schedule=schedule)
