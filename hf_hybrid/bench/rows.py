"""`RunRow`: what one finished run adds to the record, and the index the protocol and verdicts read.

A row's `units` and `seconds` are what reaching its last step cost *from step 0*: a branch's include the
trunk's cost up to its fork (the coordinator adds it), so a row is a point (cost, eval loss) on its own.
`own_seconds` is the run's own share.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .spec import BRANCH, SEGMENT, SEPARATE


@dataclass
class RunRow:
    key: str
    method: str
    seed: int
    lr_multiplier: float
    learning_rate: float
    kind: str
    budget: float
    start: int
    stop: int
    steps: int  # the schedule's length
    point: bool  # an evaluated end of a budget: a branch, a trunk's last segment, a separate run
    eval_loss: float | None
    units: float
    seconds: float
    own_seconds: float
    wall_seconds: float
    clock: str
    step_counts: dict[str, int] = field(default_factory=dict)
    losses: list[float] = field(default_factory=list)  # the training loss of each of its own steps
    details: dict[str, Any] = field(default_factory=dict)
    note: str | None = None
    replays: str | None = None
    reused_from: str | None = None  # a run that provably trains like another: that run's key
    trainable_bytes: int = 0
    engine_peak_bytes: int = 0
    device_peak_bytes: int | None = None
    eval_example_losses: list[float] | None = None
    error: str | None = None  # a run that failed twice: its last error
    attempts: int = 1
    spec: dict[str, Any] = field(default_factory=dict)  # the RunSpec it ran (`RunSpec.from_dict`)
    invocation: str | None = None  # the arena process that ran it: times compare only within one

    @property
    def failed(self) -> bool:
        return self.error is not None

    @property
    def loss(self) -> float:
        """The eval loss, infinite for a failed or diverged run (it never wins a comparison)."""
        if self.error is not None or self.eval_loss is None or not math.isfinite(self.eval_loss):
            return math.inf
        return self.eval_loss

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunRow:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


class Rows:
    """The record's rows by key, and the lookups the protocol needs."""

    def __init__(self, rows: Iterable[RunRow] = ()) -> None:
        self.by_key: dict[str, RunRow] = {}
        for row in rows:
            self.add(row)

    def add(self, row: RunRow) -> None:
        self.by_key[row.key] = row

    def __iter__(self) -> Iterator[RunRow]:
        return iter(self.by_key.values())

    def __len__(self) -> int:
        return len(self.by_key)

    def get(self, key: str) -> RunRow | None:
        return self.by_key.get(key)

    def points(self, method: str, seed: int | None = None) -> list[RunRow]:
        return [r for r in self if r.point and r.method == method and (seed is None or r.seed == seed)]


def is_point(kind: str, stop: int, steps: int, constant: bool) -> bool:
    """Which rows end a budget: a branch, a separate run, a trunk's last segment (and, on a constant
    schedule, every segment: it stops at a budget)."""
    if kind in (BRANCH, SEPARATE):
        return True
    return kind == SEGMENT and (stop == steps or constant)
