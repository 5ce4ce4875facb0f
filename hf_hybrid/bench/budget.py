"""Where the arena's budgets fork off one trunk: the warmup-stable-decay geometry of a task.

A plain run of `S` steps with transformers' `warmup_stable_decay` schedule holds its rate until its last
`cooldown * S` steps and decays it there. Two such runs of different lengths take the same steps until
the shorter one's decay begins, so one *trunk* of the full budget serves every shorter budget: at
`fork(b) = steps(b) - decay_steps(b)` a *branch* leaves the trunk (its model, optimizer, scheduler and
RNG state, through an HF checkpoint) and decays over `decay_steps(b)` steps. The branch is then, to the
last digit, the run a user would get with `max_steps = steps(b)` (`tests/test_budget.py`). The trunk's
own decay ends the full budget.

A schedule whose rate at a step depends on the total length (linear, cosine) cannot be branched: a
shorter run differs from the first step. Such runs are made one per budget (`--schedule separate`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..data import DataError
from .protocol import BUDGETS, COOLDOWN, DECAY

DECAY_SHAPES = ("1-sqrt", "linear", "cosine")
WSD = "warmup_stable_decay"


@dataclass(frozen=True)
class Budgets:
    """The budgets of one task: `max_steps` at fractions `BUDGETS`, each with its cooldown."""

    max_steps: int
    cooldown: float = COOLDOWN
    decay: str = DECAY
    warmup_steps: int = 0

    def check(self) -> None:
        """Refuse a geometry that cannot branch, naming the flag and what would work."""
        if not 0 < self.cooldown <= 0.5:
            raise DataError(f"`--cooldown_fraction` must be in (0, 0.5], got {self.cooldown}")
        if self.decay not in DECAY_SHAPES:
            raise DataError(f"`--decay_shape` must be one of {list(DECAY_SHAPES)}, got {self.decay!r}")
        forks = [self.fork(b) for b in BUDGETS[:-1]]
        if self.steps(BUDGETS[0]) < 2 or forks[0] < 1 or len(set(forks)) < len(forks):
            raise DataError(
                f"`--max_steps` {self.max_steps} is too small for branches at 1/4, 1/2 and 3/4 of the budget "
                f"with a cooldown of {self.cooldown:g} (forks at steps {forks}); use --max_steps >= 8"
            )
        if self.warmup_steps > forks[0]:
            raise DataError(
                f"the warmup ({self.warmup_steps} steps) ends after the 1/4 budget's cooldown begins (step "
                f"{forks[0]}): a branch there would not be a run of that budget. Use a shorter warmup, a "
                "larger --max_steps, or --schedule separate"
            )

    def steps(self, budget: float) -> int:
        return max(1, round(self.max_steps * budget))

    def decay_steps(self, budget: float) -> int:
        return max(1, round(self.cooldown * self.steps(budget)))

    def fork(self, budget: float) -> int:
        """The step where the branch of `budget` leaves the trunk (its decay begins)."""
        return self.steps(budget) - self.decay_steps(budget)

    def wsd(self, budget: float) -> dict[str, Any]:
        """`TrainingArguments` fields of a run of `budget` with its own decay."""
        return {
            "max_steps": self.steps(budget),
            "lr_scheduler_type": WSD,
            "lr_scheduler_kwargs": {"num_decay_steps": self.decay_steps(budget), "decay_type": self.decay},
            "warmup_steps": self.warmup_steps,
        }

    def trunk_stops(self) -> list[int]:
        """Where the trunk's segments end: every fork, then the end of the full budget."""
        return [self.fork(b) for b in BUDGETS[:-1]] + [self.max_steps]

    def describe(self) -> dict[str, Any]:
        return {
            "cooldown_fraction": self.cooldown,
            "decay_shape": self.decay,
            "warmup_steps": self.warmup_steps,
            "budgets": {str(b): {"steps": self.steps(b), "fork": self.fork(b)} for b in BUDGETS},
        }
