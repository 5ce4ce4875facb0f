"""The price of each kind of step on this task and machine, measured, in forward-pass units.

One unit is a no-grad forward over a training batch; a plain step costs what it measures (not the
textbook's 3), a blind step 0 itself (its update is in the engine's own measured milliseconds,
`engine_ms`, priced at a millisecond over a forward's seconds), a method's own kinds what running it costs
(`Method.calibration_variant`). On a task priced per token each kind also gets a price per token.
"""

from __future__ import annotations

import math
import statistics
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .methods import BLIND, ENGINE_MS, FORWARD, STEP, Method, TrialContext, parse_method
from .methods.base import token_kind
from .runner import StepTimer, quiet
from .task import BenchTask


@dataclass
class Calibration:
    forward_seconds: float
    step_seconds: dict[str, float] = field(default_factory=dict)  # per kind (shared and methods' own)
    steps: int = 0  # timed steps per kind
    errors: dict[str, float] = field(default_factory=dict)  # per kind (and "forward"): relative std. error

    def units(self, kind: str) -> float:
        if kind == BLIND:
            return 0.0
        if kind == FORWARD:
            return 1.0
        if kind == ENGINE_MS:  # measured on the run's own clock (CPU time on CPU), as the forward was
            return 1e-3 / self.forward_seconds
        if kind not in self.step_seconds:
            raise KeyError(f"no calibrated price for the step kind {kind!r}")
        return self.step_seconds[kind] / self.forward_seconds

    def price(self, kind: str, seconds: Sequence[float]) -> None:
        """Set `kind`'s price from its timed steps: their mean, and the mean's relative error."""
        self.step_seconds[kind] = statistics.fmean(seconds)
        self.errors[kind] = relative_error(seconds)

    def price_tokens(self, kind: str, seconds: Sequence[float], tokens: Sequence[int]) -> None:
        """Set a token kind's price from timed steps: their seconds over their tokens."""
        self.step_seconds[kind] = sum(seconds) / sum(tokens)
        self.errors[kind] = relative_error([s / n for s, n in zip(seconds, tokens, strict=True)])

    def cost(self, counts: Mapping[str, int]) -> float:
        """Forward units spent by a run that took `counts` steps of each kind."""
        return sum(n * self.units(kind) for kind, n in counts.items())

    def to_dict(self) -> dict[str, Any]:
        return {
            "forward_seconds": self.forward_seconds,
            "step_seconds": dict(self.step_seconds),
            "units": {kind: self.units(kind) for kind in (*self.step_seconds, FORWARD, BLIND, ENGINE_MS)},
            "timed_steps": self.steps,
            "relative_errors": dict(self.errors),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Calibration:
        return cls(
            float(data["forward_seconds"]),
            dict(data["step_seconds"]),
            int(data.get("timed_steps", 0)),
            dict(data.get("relative_errors", {})),
        )


def calibrate(
    task: BenchTask,
    methods: Sequence[Method],
    *,
    known: Calibration | None = None,
    warm_steps: int = 2,
    timed_steps: int = 8,
    seed: int = 0,
    failures: dict[str, str] | None = None,
) -> Calibration:
    """Price the forward, the plain step and methods' own kinds not priced yet (failures: by spec)."""
    if known is None:
        forward = _forward_seconds(task, seed, warm_steps, timed_steps)
        error = relative_error(forward)
        known = Calibration(statistics.fmean(forward), errors={FORWARD: error, ENGINE_MS: error})
    calibration = known
    calibration.steps = calibration.steps or timed_steps
    if STEP not in calibration.step_seconds:
        _price_kind(calibration, STEP, task, parse_method("plain"), seed, warm_steps, timed_steps)
    for method in methods:
        for kind in method.own_kinds():
            if kind in calibration.step_seconds:
                continue
            try:
                variant = method.calibration_variant(kind)
                _price_kind(calibration, kind, task, variant, seed, warm_steps, timed_steps)
            except Exception as exc:  # the arena reports the method and goes on with the others
                if failures is None:
                    raise
                failures[method.spec] = f"{type(exc).__name__}: {exc}"
    return calibration


def _context(task: BenchTask, seed: int, steps: int, output_dir: str, timer: StepTimer) -> TrialContext:
    return TrialContext(
        task=task,
        learning_rate=task.learning_rate or 1e-4,  # a step costs the same at any rate (none yet: range test)
        seed=seed,
        steps=steps,
        output_dir=output_dir,
        callbacks=[timer],
        extra_args={"eval_strategy": "no", "logging_strategy": "no"},
    )


def relative_error(seconds: Sequence[float]) -> float:
    """The standard error of the mean of `seconds`, relative to it (0 with one timing)."""
    if len(seconds) < 2:
        return 0.0
    return statistics.stdev(seconds) / math.sqrt(len(seconds)) / statistics.fmean(seconds)


def _price_kind(
    calibration: Calibration, kind: str, task: BenchTask, method: Method, seed: int, warm: int, timed: int
) -> None:
    """Price `kind` by timing `method`'s steps; where the run counted its tokens, its token kind too."""
    seconds, tokens = _step_seconds(task, method, seed, warm, timed)
    calibration.price(kind, seconds)
    if all(tokens):
        calibration.price_tokens(token_kind(kind), seconds, tokens)


def _step_seconds(
    task: BenchTask, method: Method, seed: int, warm: int, timed: int
) -> tuple[list[float], list[int]]:
    """The times of a method's steps after `warm` untimed ones, and each one's tokens (0: not counted)."""
    timer = StepTimer()
    with tempfile.TemporaryDirectory() as tmp:
        trainer = quiet(method.build(_context(task, seed, warm + timed, tmp, timer)))
        trainer.train()
    return list(timer.seconds[warm:]), list(timer.tokens[warm:])


def _forward_seconds(task: BenchTask, seed: int, warm: int, timed: int) -> list[float]:
    """The times of no-grad forward passes (train mode) over training batches."""
    cuda = torch.cuda.is_available()
    clock = time.perf_counter if cuda else time.process_time
    with tempfile.TemporaryDirectory() as tmp:
        trainer = parse_method("plain").build(_context(task, seed, 1, tmp, StepTimer()))
        model = trainer.model.to(trainer.args.device)
        model.train()
        seconds = []
        batches = iter(trainer.get_train_dataloader())
        for index in range(warm + timed):
            try:
                batch = next(batches)
            except StopIteration:
                batches = iter(trainer.get_train_dataloader())
                batch = next(batches)
            batch = {k: v.to(trainer.args.device) if torch.is_tensor(v) else v for k, v in batch.items()}
            began = clock()
            with torch.no_grad():
                trainer.compute_loss(model, batch)
            if cuda:
                torch.cuda.synchronize()
            if index >= warm:
                seconds.append(clock() - began)
    return seconds
