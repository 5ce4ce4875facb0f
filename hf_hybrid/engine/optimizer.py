"""HybridOptimizer: the real optimizer, whose `step` goes through the engine.

In the spirit of accelerate's `AcceleratedOptimizer`: it holds the real optimizer and passes
`state_dict`, `param_groups`, `zero_grad`, `train`/`eval` through, so a training loop that calls
`optimizer.step()` where it always does gets the engine's decision there: the real step, or the
predicted update (the real optimizer untouched). `step_was_predicted` says which, like accelerate's
`step_was_skipped`. The loop supplies what it measured in the step through `record()`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .engine import HybridEngine, StepOutcome, StepRecord


class HybridOptimizer(torch.optim.Optimizer):
    """Wraps `optimizer`; `record()` returns the step's `StepRecord` when `step()` is called.

    `skip_nonfinite_step=False` when the wrapped optimizer must see every real step (a fp16 GradScaler
    skips non-finite ones itself).
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        engine: HybridEngine,
        record: Callable[[], StepRecord],
        skip_nonfinite_step: bool = True,
    ) -> None:
        # The base class is not initialised on purpose: all state lives in the wrapped optimizer.
        self.optimizer = optimizer
        self.engine = engine
        self.record = record
        self.skip_nonfinite_step = skip_nonfinite_step
        self.step_was_predicted = False
        self.last_outcome: StepOutcome | None = None

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
            self.last_outcome = outcome

    def __repr__(self) -> str:
        return f"HybridOptimizer({self.optimizer!r})"
