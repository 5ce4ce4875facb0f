"""HybridOptimizer: the real optimizer, whose `step` goes through the engine.

Like accelerate's `AcceleratedOptimizer`, it passes everything else through, so a loop's `step()` gets the
engine's decision: the real step or the predicted update (`step_was_predicted`). A loop passes `record`,
or opens each step with `begin_step()` and hands over `add_loss` and `set_grad_norm`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from .engine import HybridEngine, StepOutcome, StepPlan, StepRecord


class HybridOptimizer(torch.optim.Optimizer):
    """Wraps `optimizer`; `skip_nonfinite_step=False` when it must see every real step (a GradScaler)."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        engine: HybridEngine,
        record: Callable[[], StepRecord] | None = None,
        skip_nonfinite_step: bool = True,
        *,
        mean_over_ranks: Callable[[torch.Tensor], torch.Tensor] = lambda total: total,
        learning_rate: Callable[[], float] | None = None,
        on_outcome: Callable[[StepOutcome, float], None] | None = None,
    ) -> None:
        # The base class is not initialised on purpose: all state lives in the wrapped optimizer.
        self.optimizer = optimizer
        self.engine = engine
        self.record = record or self._measured
        self.skip_nonfinite_step = skip_nonfinite_step
        self.mean_over_ranks = mean_over_ranks
        self.learning_rate = learning_rate or (lambda: float(self.optimizer.param_groups[0]["lr"]))
        self.on_outcome = on_outcome
        self.step_was_predicted = False
        self.last_outcome: StepOutcome | None = None
        self.plan: StepPlan | None = None
        self._losses: list[torch.Tensor] = []
        self._grad_norm: float | None = None
        self._started = 0.0

    # ---- one step's measurements ----------------------------------------------------------------

    def begin_step(self, step_number: int | None = None) -> StepPlan:
        """Open an optimizer step: the engine decides its phase (`plan`); its measurements start empty."""
        self._losses, self._grad_norm, self._started = [], None, time.perf_counter()
        self.plan = self.engine.begin_step(step_number)
        return self.plan

    def add_loss(self, loss: torch.Tensor) -> None:
        """A micro-batch's loss, already scaled for gradient accumulation (as the loop logs it)."""
        self._losses.append(loss.detach())

    def set_grad_norm(self, grad_norm: float | None) -> None:
        self._grad_norm = grad_norm

    def _measured(self) -> StepRecord:
        loss = None
        if self._losses:
            loss = float(self.mean_over_ranks(torch.stack(self._losses).sum()))
        return StepRecord(loss, self._grad_norm, self.learning_rate())

    @property
    def state(self) -> Any:
        return self.optimizer.state

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, groups: list[dict[str, Any]]) -> None:
        self.optimizer.param_groups = groups

    @property
    def defaults(self) -> dict[str, Any]:
        return self.optimizer.defaults

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self.optimizer.add_param_group(param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict)

    def train(self) -> None:
        """Schedule-free optimizers switch modes; the others have no `train`."""
        if callable(getattr(self.optimizer, "train", None)):
            self.optimizer.train()

    def eval(self) -> None:
        if callable(getattr(self.optimizer, "eval", None)):
            self.optimizer.eval()

    def step(self, closure: Callable[[], float] | None = None) -> None:
        """The engine's step: the real `optimizer.step(closure)`, or the predicted update."""
        with self.engine.timer.part("optimizer_wrapper"):  # what this wrapper adds is the engine's cost
            outcome = self.engine.finish_step(
                self.record(),
                lambda: self.optimizer.step(closure),
                skip_nonfinite_step=self.skip_nonfinite_step,
            )
            self.step_was_predicted = not outcome.phase.runs_backward
            self.last_outcome, self.plan = outcome, None
            if self.on_outcome is not None:
                self.on_outcome(outcome, time.perf_counter() - self._started)

    def __repr__(self) -> str:
        return f"HybridOptimizer({self.optimizer!r})"
