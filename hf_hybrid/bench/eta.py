"""How long an arena has left, on this machine's wall clock.

The plan is known only stage by stage (a method's runs wait for plain's race), so the runs planned now are
a floor, not the total: until they reach it, the total is the protocol's usual cost, counted in the six
built-in records (`USUAL`), and the estimate says it is a guess. A run's wall time is a start-up (a fresh
process, the model, the evaluation) plus its steps: both are fitted to the runs finished so far; before
the first one, a step costs what the calibration timed and a start-up `FIRST_START_UP`.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

# (runs, full budgets of steps) in the records of the six built-in tasks: plain's race, frontier and
# schedule check on one seed; each other seed of plain; a method on one seed; each other seed of a method
USUAL = {"plain": (15.0, 2.85), "plain_seed": (3.0, 1.0), "method": (8.0, 1.5), "method_seed": (1.5, 0.25)}
FIRST_START_UP = 20.0  # seconds: importing the libraries, building the model, evaluating (2-core machine)


def usual_cost(seeds: int, methods: int) -> tuple[float, float]:
    """(runs, full budgets of steps) an arena of `seeds` seeds and `methods` methods usually takes."""
    others = max(0, seeds - 1)
    parts = [(1, USUAL["plain"]), (others, USUAL["plain_seed"])]
    parts += [(methods, USUAL["method"]), (methods * others, USUAL["method_seed"])]
    return sum(n * c[0] for n, c in parts), sum(n * c[1] for n, c in parts)


@dataclass
class Eta:
    """The wall time left, from the runs finished so far and the runs still to come."""

    workers: int
    max_steps: int
    usual_runs: float
    usual_steps: float  # in steps
    step_seconds: float  # a first guess of one step's seconds (the calibration's)
    finished: list[tuple[int, float]] = field(default_factory=list)  # (steps, wall seconds) of each run
    began: float = field(default_factory=time.perf_counter)

    def add(self, steps: int, wall: float) -> None:
        self.finished.append((steps, wall))

    def fit(self) -> tuple[float, float]:
        """(start-up seconds of a run, seconds of a step), least squares over the finished runs."""
        if not self.finished:
            return FIRST_START_UP, self.step_seconds
        steps = [s for s, _ in self.finished]
        walls = [w for _, w in self.finished]
        if len(set(steps)) < 2:
            per_step = self.step_seconds
        else:
            mean_steps, mean_wall = statistics.fmean(steps), statistics.fmean(walls)
            spread = sum((s - mean_steps) ** 2 for s in steps)
            per_step = (
                sum((s - mean_steps) * (w - mean_wall) for s, w in zip(steps, walls, strict=True)) / spread
            )
            per_step = max(per_step, 0.0)
        start_up = max(statistics.fmean(w - per_step * s for s, w in self.finished), 0.0)
        return start_up, per_step

    def left(self, planned_runs: int, planned_steps: int) -> tuple[float, bool]:
        """(seconds left, whether it is a guess from the usual cost rather than the runs planned)."""
        done_runs, done_steps = len(self.finished), sum(s for s, _ in self.finished)
        usual_runs, usual_steps = self.usual_runs - done_runs, self.usual_steps - done_steps
        guess = usual_runs > planned_runs or usual_steps > planned_steps
        runs, steps = max(planned_runs, usual_runs), max(planned_steps, usual_steps)
        start_up, per_step = self.fit()
        return (runs * start_up + steps * per_step) / max(1, self.workers), guess

    def text(self, planned_runs: int, planned_steps: int) -> str:
        seconds, guess = self.left(planned_runs, planned_steps)
        how = "a guess from the protocol's usual cost" if guess else "as planned"
        return f"~{duration(seconds)} left on the wall clock ({how})"


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
