"""Where a point of the arena lives: the run spec that is a (method, seed, rate, budget) point, the trunk
segments it continues, and what of that chain is recorded, ready to run, or must be rebuilt.

`Chains` is the planner's bookkeeping, apart from what the protocol decides (`plan.py`): a stage asks for
points with `_need`/`_want`, and the chains turn each into the first spec that can run now (a trunk
segment before a branch, a segment again when its checkpoint is gone).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .budget import Budgets
from .methods import BRANCHED, CONSTANT, SEPARATE_RUNS, Method
from .protocol import BUDGETS, READ_AT
from .rows import Rows, RunRow
from .spec import BRANCH, SEGMENT, SEPARATE, RunSpec, schedule_json


class Chains:
    """The specs of points and their trunk chains, over a record's rows."""

    def __init__(
        self,
        budgets: Budgets,
        rows: Rows,
        methods: Sequence[Method],
        nulls: dict[str, Method],
        base_learning_rate: float | None,
        task_schedule: dict[str, Any],
        out: str | Path,
        mode: str,
    ) -> None:
        self.budgets, self.rows = budgets, rows
        self.methods, self.nulls = list(methods), dict(nulls)
        self.base = base_learning_rate
        self.task_schedule = task_schedule  # the task's own `lr_scheduler_type`, `warmup_steps`
        self.checkpoints = Path(out).resolve() / "checkpoints"
        self.mode = mode  # "wsd" (a trunk per rate, branches) or "separate" (a run per budget)
        self.waiting = False  # some stage waits for a point that is not recorded yet
        self.ready: dict[str, RunSpec] = {}
        self.rebuild: dict[str, RunSpec] = {}
        self.reuse: dict[str, tuple[RunSpec, str]] = {}
        self.doomed: dict[str, tuple[RunSpec, str]] = {}
        self.used: set[str] = set()

    def point(
        self, method: str, seed: int, multiplier: float, budget: float, mode: str | None = None
    ) -> RunRow | None:
        """The row that is this point (also read off a separate run of that budget)."""
        row = self._row(self.point_spec(method, seed, multiplier, budget, mode))
        if row is None and mode in (None, self.mode):
            row = self._row(self.run_spec(method, seed, multiplier, budget))
        return row

    def null_point(
        self, null: Method, parent: str, seed: int, multiplier: float, budget: float
    ) -> RunRow | None:
        """The null control's row that replays `parent`'s point."""
        parent_row = self.point(parent, seed, multiplier, budget)
        if parent_row is None:
            return None
        return self._row(self.replay_spec(null, parent_row))

    def run_spec(self, method: str, seed: int, multiplier: float, budget: float = READ_AT) -> RunSpec:
        """One complete run of `budget` (a method's other seeds, a same-trajectory method): to the last
        digit the trunk's branch there, without a trunk to share."""
        return self._separate_spec(method, seed, multiplier, budget, own=self.mode == "separate")

    def point_spec(
        self, method: str, seed: int, multiplier: float, budget: float, mode: str | None = None
    ) -> RunSpec:
        structure = self._structure(method, mode or self.mode)
        if structure == SEPARATE_RUNS:
            own = (mode or self.mode) == "separate"
            return self._separate_spec(method, seed, multiplier, budget, own=own)
        stops = self._stops(structure)
        if structure == CONSTANT or budget == READ_AT:
            stop = self.budgets.steps(budget)
            start = max([s for s in stops if s < stop], default=0)
            return self._segment(method, seed, multiplier, start, stop)
        fork, schedule = self.budgets.fork(budget), self.budgets.wsd(budget)
        return self._spec(method, seed, multiplier, BRANCH, budget, fork, schedule, trunk=True)

    def _structure(self, method: str, mode: str) -> str:
        if mode == "separate":
            return SEPARATE_RUNS
        if method == "plain":
            return BRANCHED
        return next(m for m in [*self.methods, *self.nulls.values()] if m.spec == method).budget_schedule

    def _stops(self, structure: str) -> list[int]:
        if structure == CONSTANT:
            return [self.budgets.steps(b) for b in BUDGETS]
        return self.budgets.trunk_stops()

    def _segment(self, method: str, seed: int, multiplier: float, start: int, stop: int) -> RunSpec:
        structure = self._structure(method, "wsd")
        stops = self._stops(structure)
        schedule = self.budgets.wsd(READ_AT)
        if structure == CONSTANT:
            schedule = {**schedule, "lr_scheduler_type": "constant_with_warmup", "lr_scheduler_kwargs": {}}
        budget = next((b for b, s in zip(BUDGETS, stops, strict=True) if s == stop), READ_AT)
        evaluate = stop == stops[-1] or structure == CONSTANT
        return self._spec(method, seed, multiplier, SEGMENT, budget, start, schedule, True, evaluate, stop)

    def _separate_spec(
        self, method: str, seed: int, multiplier: float, budget: float, own: bool = False
    ) -> RunSpec:
        steps = self.budgets.steps(budget)
        schedule = {"max_steps": steps, **self.task_schedule} if own else self.budgets.wsd(budget)
        return self._spec(method, seed, multiplier, SEPARATE, budget, 0, schedule)

    def _spec(
        self,
        method: str,
        seed: int,
        multiplier: float,
        kind: str,
        budget: float,
        start: int,
        schedule: dict[str, Any],
        trunk: bool = False,
        evaluate: bool = True,
        stop: int | None = None,
    ) -> RunSpec:
        return RunSpec(
            method=method,
            seed=seed,
            lr_multiplier=multiplier,
            learning_rate=self.base * multiplier,
            kind=kind,
            budget=budget,
            start=start,
            stop=int(schedule["max_steps"]) if stop is None else stop,
            schedule_json=schedule_json(schedule),
            trunk_dir=str(self.trunk_dir(method, seed, multiplier)) if trunk else None,
            evaluate=evaluate,
            per_example=evaluate,  # every point: pairs at any budget, the frontier's slope, the checks
        )

    def replay_spec(self, null: Method, parent: RunRow) -> RunSpec:
        """The null control's run of `parent`: the same spec, its phases replayed with nothing applied."""
        spec = RunSpec.from_dict(parent.spec)
        trunk = (
            None if spec.trunk_dir is None else str(self.trunk_dir(null.spec, spec.seed, spec.lr_multiplier))
        )
        return RunSpec.from_dict(
            {
                **spec.to_dict(),
                "method": null.spec,
                "trunk_dir": trunk,
                "replays": parent.key,
                "replay": tuple(parent.details.get("phases") or ()),
            }
        )

    def segment_before(self, spec: RunSpec) -> RunSpec:
        """The trunk segment that ends where `spec` starts (for a null: the replay of its parent's)."""
        if spec.replays is not None:
            parent_spec = self.segment_before(RunSpec.from_dict(self.rows.get(spec.replays).spec))
            parent = self._row(parent_spec)
            null = next(n for n in self.nulls.values() if n.spec == spec.method)
            return self.replay_spec(null, parent)
        stops = self._stops(self._structure(spec.method, "wsd"))
        start = max([s for s in stops if s < spec.start], default=0)
        return self._segment(spec.method, spec.seed, spec.lr_multiplier, start, spec.start)

    def _need(self, points: Sequence[RunSpec]) -> bool:
        """True when every point is recorded; otherwise the missing ones join the plan and the stage that
        asked waits."""
        missing = [p for p in points if self._row(p) is None]
        if missing:
            self.waiting = True
            self._want(missing)
        return not missing

    def _want(self, points: Sequence[RunSpec]) -> None:
        if points:
            self.waiting = True
        for point in points:
            ready = self._ready(point)
            if ready is not None:
                self.ready.setdefault(ready.key, ready)

    def _ready(self, spec: RunSpec) -> RunSpec | None:
        """`spec` when what it resumes from is recorded (its checkpoint rebuilt if gone), else the first
        unrecorded segment of its trunk; None when a null's parent row is missing."""
        if spec.start == 0:
            return spec
        if spec.replays is not None and self.rows.get(spec.replays) is None:
            return None
        before = self.segment_before(spec)
        row = self._row(before)
        if row is None:
            return self._ready(before)
        if row.failed:
            self.doomed.setdefault(spec.key, (spec, f"the trunk segment it continues failed ({row.error})"))
            return None
        if not Path(spec.checkpoint).is_dir():
            self.rebuild.setdefault(before.key, self._ready_rebuild(before))
        return spec

    def _ready_rebuild(self, segment: RunSpec) -> RunSpec:
        """A recorded segment to run again for its checkpoint: the earliest whose own start is on disk."""
        if segment.start == 0 or Path(segment.checkpoint).is_dir():
            return segment
        return self._ready_rebuild(self.segment_before(segment))

    def _row(self, spec: RunSpec) -> RunRow | None:
        row = self.rows.get(spec.key)
        if row is not None and row.key not in self.used:
            self.used.add(row.key)
            if row.reused_from is not None:  # it stands on the run it reuses
                self.used.add(row.reused_from)
            elif spec.start > 0 and not (spec.replays is not None and self.rows.get(spec.replays) is None):
                self._row(self.segment_before(spec))  # what a recorded point stands on is used too
        return row

    def trunk_dir(self, method: str, seed: int, multiplier: float) -> Path:
        slug = re.sub(r"[^A-Za-z0-9.=-]+", "_", method)[:40]
        digest = hashlib.sha1(method.encode()).hexdigest()[:8]
        return self.checkpoints / f"{slug}-{digest}-seed{seed}-x{multiplier:g}"
