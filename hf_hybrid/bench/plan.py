"""The arena's protocol as a pure function of the record: which runs are needed next.

`Planner(...).plan()` reads the rows and returns every spec whose inputs are known and whose row is not in
the record yet, and the decisions taken so far. It is called again after every finished run, so a killed
and rerun arena takes the same decisions and runs the same specs as an uninterrupted one: nothing but the
record decides (eval losses and units do; times never do).

1. Without a base learning rate, a range test sets the sweep's centre (`range_test.py`).
2. The plain sweep on the first seed by successive halving (`sweep.py`); each budget's best rate gives
   that budget's frontier point (a per-budget tuned frontier).
3. The schedule check: plain runs with the task's own schedule at the full budget's best rate and its
   neighbours, against the trunk; when the trunk is worse beyond twice the eval noise, every run falls
   back to separate, fully decayed runs with the task's schedule (the report says so).
4. The other seeds' plain frontiers at the first seed's per-budget rates: the seed band.
5. Each method on the first seed: its rates raced as plain's sweep races its own, at every budget: all at
   1/4, then the winner and the rate below it on to the next budget (the short-horizon bias: a rate that
   wins early may overfit or stall late); each budget is read at its own winner. Stopped after 1/2 when it
   reads below the plain frontier by more than twice the seed band. A same-trajectory method runs once, at
   the plain rate.
6. Null controls replay their method's runs at its chosen rate; where the method predicted nothing, its
   null is the plain run, reused.
7. A method's other seeds run only where they can change its verdict: its first seed above 1 + band (it
   may win), or between 1 - 2 band and 1 - band (it may lose), at the budget it is read at.

A stage starts as soon as its inputs are decided, so that workers are not left idle: the other seeds' points
at a budget once the sweep has passed it (4 beside 2), the methods once the full budget's rate is known
(5 beside 3: a fallback, rare, then leaves their runs unused).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .budget import BUDGETS, Budgets
from .frontier import speedup
from .methods import BRANCHED, CONSTANT, SEPARATE_RUNS, Method
from .rows import Rows, RunRow
from .spec import BRANCH, SEGMENT, SEPARATE, RunSpec, schedule_json
from .sweep import successive_halving

ONE_SEED_BAND = 0.10  # the band a one-seed arena assumes
EARLY_STOP_AT = 0.5  # where a method far below the plain frontier stops
PREDICT = "predict"


@dataclass(frozen=True)
class Protocol:
    """The arena's settings (flags of `hf-hybrid bench`)."""

    seeds: Sequence[int] = (0,)
    lr_multipliers: Sequence[float] = (0.5, 1.0, 2.0, 4.0)
    method_lr_multipliers: Sequence[float] | None = None  # None: each method's own `lr_multipliers`
    widen: int = 3
    cooldown: float = 0.2
    decay: str = "1-sqrt"
    schedule: str = "wsd"
    schedule_check: bool = True
    warm_steps: int = 2
    timed_steps: int = 8


@dataclass
class Decisions:
    """What the protocol decided (written to the record for the report and verdicts)."""

    base_learning_rate: float | None = None
    mode: str = "wsd"
    sweep: dict[str, Any] = field(default_factory=dict)
    best: dict[float, float] = field(default_factory=dict)  # budget -> plain multiplier
    untuned: dict[float, str] = field(default_factory=dict)
    schedule_check: dict[str, Any] = field(default_factory=dict)
    band: float | None = None
    methods: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "base_learning_rate": self.base_learning_rate,
            "mode": self.mode,
            "sweep": self.sweep,
            "best": {str(b): m for b, m in self.best.items()},
            "untuned": {str(b): why for b, why in self.untuned.items()},
            "schedule_check": self.schedule_check,
            "seed_band": self.band,
            "methods": self.methods,
        }


class Blocked(Exception):
    """A stage waits for these points (or for nothing it can start yet: empty)."""

    def __init__(self, points: Sequence[RunSpec] = ()) -> None:
        super().__init__(f"{len(points)} point(s) needed")
        self.points = list(points)


@dataclass
class Plan:
    specs: list[RunSpec]  # ready to run now
    rebuild: list[RunSpec]  # recorded segments to run again: a ready spec needs their missing checkpoint
    reuse: list[tuple[RunSpec, str]]  # specs that provably train like a recorded run (its key)
    doomed: list[tuple[RunSpec, str]]  # specs that cannot run: what they continue failed (why)
    decisions: Decisions
    used: set[str]  # every recorded key the plan stands on (the rest is no longer part of it)
    complete: bool


class Planner:
    def __init__(
        self,
        protocol: Protocol,
        budgets: Budgets,
        rows: Rows,
        methods: Sequence[Method],
        nulls: dict[str, Method],
        base_learning_rate: float | None,
        task_schedule: dict[str, Any],
        out: str | Path,
    ) -> None:
        self.protocol, self.budgets, self.rows = protocol, budgets, rows
        self.methods, self.nulls = list(methods), dict(nulls)
        self.base = base_learning_rate
        self.task_schedule = task_schedule  # the task's own `lr_scheduler_type`, `warmup_steps`
        self.checkpoints = Path(out).resolve() / "checkpoints"
        self.decisions = Decisions(mode=protocol.schedule)
        self.first = protocol.seeds[0]
        self.ready: dict[str, RunSpec] = {}
        self.rebuild: dict[str, RunSpec] = {}
        self.reuse: dict[str, tuple[RunSpec, str]] = {}
        self.doomed: dict[str, tuple[RunSpec, str]] = {}
        self.used: set[str] = set()

    # ---- the stages ------------------------------------------------------------------------------------

    def plan(self) -> Plan:
        blocked = False
        try:
            self._base_rate()
            swept = not self._stage(self._sweep)
            checking = swept and self._stage(self._schedule_check)
            if self.decisions.schedule_check.get("fallback"):
                swept = not self._stage(self._sweep)  # again, in separate runs
            # each budget's best rate is final once the sweep has passed it: the other seeds start there
            blocked |= self._stage(self._other_seeds)
            if not swept:
                raise Blocked()
            # the methods need the full budget's rate only: they run beside the check, whose fallback
            # (rare) leaves their runs unused
            blocked |= checking
            for method in self.methods:
                blocked |= self._stage(lambda m=method: self._method(m))
        except Blocked as stop:
            self._want(stop.points)
            blocked = True
        complete = not blocked and not self.ready and not self.reuse and not self.doomed
        return Plan(
            list(self.ready.values()),
            list(self.rebuild.values()),
            list(self.reuse.values()),
            list(self.doomed.values()),
            self.decisions,
            self.used,
            complete,
        )

    def _stage(self, stage: Callable[[], None]) -> bool:
        """Run a stage that may block without stopping the next ones (methods are independent)."""
        try:
            stage()
            return False
        except Blocked as stop:
            self._want(stop.points)
            return True

    def _base_rate(self) -> None:
        if self.base is None:
            from .range_test import range_test_spec, suggested_rate

            spec = range_test_spec(self.budgets, self.first)
            row = self._row(spec)
            if row is None:
                raise Blocked([spec])
            self.base = suggested_rate(row)
        self.decisions.base_learning_rate = self.base

    def _sweep(self) -> None:
        mode = self.decisions.mode

        def loss_at(multiplier: float, budget: float) -> float | None:
            row = self.point("plain", self.first, multiplier, budget, mode)
            return None if row is None else row.loss

        state = successive_halving(self.protocol.lr_multipliers, self.protocol.widen, loss_at)
        self.decisions.sweep = state.to_dict()
        self.decisions.best, self.decisions.untuned = dict(state.best), dict(state.untuned)
        if not state.complete:
            raise Blocked([self.point_spec("plain", self.first, m, b, mode) for m, b in state.wanted])

    def _schedule_check(self) -> None:
        """The trunk's full-budget loss against the task's own schedule at the trunk's rate and its
        neighbours; a trunk worse beyond twice the paired eval noise sends every run to separate runs."""
        if self.protocol.schedule != "wsd" or not self.protocol.schedule_check:
            return
        best = self.decisions.best[1.0]
        trunk = self.point("plain", self.first, best, 1.0, "wsd")
        specs = [self._separate_spec("plain", self.first, best * f, 1.0, own=True) for f in (0.5, 1.0, 2.0)]
        rows = [self._row(s) for s in specs]
        if any(r is None for r in rows):
            raise Blocked([s for s, r in zip(specs, rows, strict=True) if r is None])
        own = min(rows, key=lambda r: (r.loss, r.lr_multiplier))
        noise = paired_noise(trunk.eval_example_losses or [], own.eval_example_losses or [])
        fallback = trunk.loss - own.loss > 2 * noise
        self.decisions.schedule_check = {
            "schedule": self.task_schedule.get("lr_scheduler_type"),
            "trunk_lr_multiplier": best,
            "trunk_eval_loss": trunk.loss,
            "own_schedule_eval_loss": own.loss,
            "own_schedule_lr_multiplier": own.lr_multiplier,
            "own_schedule_rate_at_an_edge": own.lr_multiplier != best,
            "paired_eval_noise": noise,
            "fallback": fallback,
        }
        if fallback:
            self.decisions.mode = "separate"

    def _other_seeds(self) -> None:
        """The other seeds' plain points at every budget whose best rate the sweep has decided (final
        once decided: the sweep never revisits a budget it has passed)."""
        points = [
            self.point_spec("plain", seed, rate, b)
            for seed in self.protocol.seeds[1:]
            for b, rate in self.decisions.best.items()
        ]
        self._want([p for p in points if self._row(p) is None])
        self.decisions.band = self._band()

    def _band(self) -> float | None:
        """How far one seed's best plain point (its lowest eval loss; the full budget's unless the task
        overfits) reads from 1.0x on another seed's frontier (the largest over pairs); None with fewer
        than two complete seeds."""
        frontiers = {s: self.frontier(s) for s in self.protocol.seeds}
        frontiers = {s: f for s, f in frontiers.items() if f is not None}
        if len(frontiers) < 2:
            return None
        return max(
            abs(read(points, best_point(other), "units") - 1.0)
            for s, points in frontiers.items()
            for t, other in frontiers.items()
            if s != t
        )

    def _decided_band(self) -> float:
        """The seed band once every seed's frontier is in (a one-seed arena assumes `ONE_SEED_BAND`)."""
        if len(self.protocol.seeds) < 2:
            return ONE_SEED_BAND
        if any(self.frontier(s) is None for s in self.protocol.seeds):
            raise Blocked()
        return self.decisions.band

    # ---- a method ------------------------------------------------------------------------------------

    def _method(self, method: Method) -> None:
        record: dict[str, Any] = self.decisions.methods.setdefault(method.spec, {})
        reason = method.provably_plain(self.budgets.max_steps)
        if reason is not None:
            self._provably_plain(method, reason, record)
            return
        if method.same_trajectory:
            self._same_trajectory(method, record)
            return
        factors = self.protocol.method_lr_multipliers or method.lr_multipliers
        rates = sorted(self.decisions.best[1.0] * f for f in factors)
        self._race(method, rates, method_budgets(method, self.decisions.mode), record)
        if record.get("stopped_at") is not None:
            return
        budget, rate = self._read_at(method, record)
        self._null(method, rate, [self.first])
        self._more_seeds(method, rate, budget, record)

    def _race(self, method: Method, rates: list[float], budgets: list[float], record: dict[str, Any]) -> None:
        """The method's rate at each of its budgets, as plain's sweep picks its own: every rate at the
        first budget, then on to the next budget the winner and the rate below it (a longer budget's best
        rate is never larger), each budget's winner by unit speed-up there; stops after 1/2 when that
        budget's winner reads below the plain frontier by more than twice the band."""
        record["race"], record["lr_multiplier_by_budget"] = {}, {}
        active, winner, previous = rates, rates[0], 0.0
        for budget in budgets:
            # once, on leaving 1/2, with 1/2's winner (a later winner's 1/2 point is not its reading)
            if previous <= EARLY_STOP_AT < budget and self._stops_early(method, winner, budgets, record):
                return
            previous = budget
            self._need([self._method_point(method, r, budget) for r in active])
            winner = self._winner(method, active, budget)
            record["race"][str(budget)] = {"rates": active, "winner": winner}
            record["lr_multiplier_by_budget"][str(budget)] = winner
            record["lr_multiplier"] = winner
            active = [*[r for r in rates if r < winner][-1:], winner]

    def _read_at(self, method: Method, record: dict[str, Any]) -> tuple[float, float]:
        """(budget, rate) where the verdict reads the method: its lowest eval loss over its budgets, each
        at its own race's winner (the shorter budget on a tie). The plain frontier is read at its best
        point so far; a method is read at its best budget too, so that on a task that overfits neither
        side is charged for training past its best."""
        points = {
            float(b): (self.point(method.spec, self.first, rate, float(b)), rate)
            for b, rate in record["lr_multiplier_by_budget"].items()
        }
        budget = min(points, key=lambda b: (points[b][0].loss, b))
        rate = points[budget][1]
        record.update(read_at=budget, lr_multiplier=rate)
        return budget, rate

    def _method_point(self, method: Method, rate: float, budget: float) -> RunSpec:
        """The first seed's point of `method` at `budget`; a run that provably trains like plain there
        (a hybrid run inside its warmup) is the plain run at that rate, reused when it is recorded."""
        spec = self.point_spec(method.spec, self.first, rate, budget)
        if self._row(spec) is None and method.provably_plain(
            self.budgets.max_steps, self.budgets.steps(budget)
        ):
            twin = self._row(self.point_spec("plain", self.first, rate, budget))
            if twin is not None:
                self.reuse.setdefault(spec.key, (spec, twin.key))
        return spec

    def _winner(self, method: Method, rates: Sequence[float], budget: float) -> float:
        """The rate with the best unit speed-up at `budget` on the first seed (then the lower loss)."""
        frontier = self.frontier(self.first)

        def score(rate: float) -> tuple[float, float, float]:
            row = self.point(method.spec, self.first, rate, budget)
            return (-read(frontier, row, "units"), row.loss, rate)

        return min(rates, key=score)

    def _stops_early(self, method: Method, chosen: float, budgets: list[float], record: dict) -> bool:
        """A method that reads below the plain frontier by more than twice the band at 1/2 stops there."""
        if EARLY_STOP_AT not in budgets:
            return False
        row = self.point(method.spec, self.first, chosen, EARLY_STOP_AT)
        value = read(self.frontier(self.first), row, "units")
        if value >= 1.0 - 2 * self._decided_band():
            return False
        record["stopped_at"] = EARLY_STOP_AT
        self._null(method, chosen, [self.first])
        return True

    def _more_seeds(self, method: Method, rate: float, budget: float, record: dict[str, Any]) -> None:
        """The other seeds, each one run of the budget the verdict reads, where they can change it."""
        if len(self.protocol.seeds) < 2:
            return
        band = self._decided_band()
        value = read(self.frontier(self.first), self.point(method.spec, self.first, rate, budget), "units")
        if not (value > 1.0 + band or 1.0 - 2 * band <= value < 1.0 - band):
            record["other_seeds"] = "not run: within the band, or below 1 - 2 band (one seed decides)"
            return
        seeds = list(self.protocol.seeds[1:])
        self._need([self.run_spec(method.spec, s, rate, budget) for s in seeds])
        self._null(method, rate, seeds)

    def _provably_plain(self, method: Method, reason: str, record: dict[str, Any]) -> None:
        """A method that trains exactly like plain here: its points are plain's at the full budget's
        rate, reused, never run (nor its null's)."""
        rate = self.decisions.best[1.0]
        record.update(lr_multiplier=rate, provably_plain=reason)
        for budget in method_budgets(method, self.decisions.mode):
            spec = self.point_spec(method.spec, self.first, rate, budget)
            twin = self.point("plain", self.first, rate, budget)
            if self._row(spec) is None and twin is not None:
                self.reuse.setdefault(spec.key, (spec, twin.key))
        self._null(method, rate, [self.first])

    def _same_trajectory(self, method: Method, record: dict[str, Any]) -> None:
        """One full run per seed at the plain full-budget rate, read against plain's time."""
        rate = self.decisions.best[1.0]
        record["lr_multiplier"] = rate
        self._need([self.run_spec(method.spec, s, rate) for s in self.protocol.seeds])

    def _null(self, method: Method, rate: float, seeds: Sequence[int]) -> None:
        """The null control runs each of the method's runs at `rate` again, as itself (a uniform draw for
        selective backprop) or replaying its phases (a hybrid run's); where a hybrid run predicted nothing
        on a seed, its null there is the plain run (same steps, nothing skipped), reused."""
        null = self.nulls.get(method.spec)
        if null is None:
            return
        parents = sorted(
            (r for r in self.rows if r.method == method.spec and r.seed in seeds and r.lr_multiplier == rate),
            key=lambda r: (r.seed, r.stop, r.kind),
        )
        for parent in parents:
            self.used.add(parent.key)
        points = []
        for parent in parents:
            spec = self.replay_spec(null, parent)
            if self._row(spec) is not None:
                continue
            twin = self._plain_twin(parent, parents) if null.replays_parent else None
            if parent.reused_from is not None and null.replays_parent:  # the parent is plain's run
                twin = self.rows.get(parent.reused_from)
            if twin is not None:
                self.reuse.setdefault(spec.key, (spec, twin.key))
                continue
            points.append(spec)
        self._need(points)

    def _plain_twin(self, parent: RunRow, family: Sequence[RunRow]) -> RunRow | None:
        """The plain row that trains exactly like the null of `parent`, when the parent's whole trunk on
        its seed predicted nothing."""
        if any(PREDICT in (r.details.get("phases") or ()) for r in family if r.seed == parent.seed):
            return None
        spec = RunSpec.from_dict({**parent.spec, "method": "plain", "replays": None, "replay": None})
        return self.rows.get(spec.key)

    # ---- points and their chains ------------------------------------------------------------------------

    def frontier(self, seed: int) -> list[RunRow] | None:
        """The plain points of `seed` at each budget's best rate, or None while one is missing."""
        if any(b not in self.decisions.best for b in BUDGETS):
            return None
        points = [self.point("plain", seed, self.decisions.best[b], b) for b in BUDGETS]
        return None if any(p is None for p in points) else points

    def point(
        self, method: str, seed: int, multiplier: float, budget: float, mode: str | None = None
    ) -> RunRow | None:
        """The row that is this point (also read off a separate run of that budget)."""
        row = self._row(self.point_spec(method, seed, multiplier, budget, mode))
        if row is None and mode in (None, self.decisions.mode):
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

    def run_spec(self, method: str, seed: int, multiplier: float, budget: float = 1.0) -> RunSpec:
        """One complete run of `budget` (a method's other seeds, a same-trajectory method): to the last
        digit the trunk's branch there, without a trunk to share."""
        return self._separate_spec(method, seed, multiplier, budget, own=self.decisions.mode == "separate")

    def point_spec(
        self, method: str, seed: int, multiplier: float, budget: float, mode: str | None = None
    ) -> RunSpec:
        structure = self._structure(method, mode or self.decisions.mode)
        if structure == SEPARATE_RUNS:
            own = (mode or self.decisions.mode) == "separate"
            return self._separate_spec(method, seed, multiplier, budget, own=own)
        stops = self._stops(structure)
        if structure == CONSTANT or budget == 1.0:
            stop = self.budgets.steps(budget)
            return self._segment(
                method, seed, multiplier, max([s for s in stops if s < stop], default=0), stop
            )
        return self._spec(
            method, seed, multiplier, BRANCH, budget, self.budgets.fork(budget), self.budgets.wsd(budget),
            trunk=True, per_example=False,
        )  # fmt: skip

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
        schedule = self.budgets.wsd(1.0)
        if structure == CONSTANT:
            schedule = {**schedule, "lr_scheduler_type": "constant_with_warmup", "lr_scheduler_kwargs": {}}
        budget = next((b for b, s in zip(BUDGETS, stops, strict=True) if s == stop), 1.0)
        evaluate = stop == stops[-1] or structure == CONSTANT
        return self._spec(
            method, seed, multiplier, SEGMENT, budget, start, schedule, trunk=True, evaluate=evaluate,
            stop=stop, per_example=evaluate and method == "plain" and budget == 1.0,
        )  # fmt: skip

    def _separate_spec(
        self, method: str, seed: int, multiplier: float, budget: float, own: bool = False
    ) -> RunSpec:
        steps = self.budgets.steps(budget)
        schedule = {"max_steps": steps, **self.task_schedule} if own else self.budgets.wsd(budget)
        per_example = method == "plain" and budget == 1.0
        return self._spec(method, seed, multiplier, SEPARATE, budget, 0, schedule, per_example=per_example)

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
        per_example: bool = False,
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
            per_example=per_example,
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
                "per_example": False,
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

    def _need(self, points: Sequence[RunSpec]) -> None:
        """Go on only when every point is recorded; otherwise block on what is missing."""
        missing = [p for p in points if self._row(p) is None]
        if missing:
            raise Blocked(missing)

    def _want(self, points: Sequence[RunSpec]) -> None:
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


def method_budgets(method: Method, mode: str) -> list[float]:
    """The budgets a method is read at: every one, or 1/4 and all for one that runs them separately."""
    if method.budget_schedule == SEPARATE_RUNS and mode != "separate":
        return [BUDGETS[0], 1.0]
    return list(BUDGETS)


def best_point(frontier: Sequence[RunRow]) -> RunRow:
    """A frontier's lowest eval loss (the shorter budget on a tie): where a task that overfits is read."""
    return min(frontier, key=lambda p: (p.loss, p.budget))


def read(frontier: Sequence[RunRow], row: RunRow, cost: str) -> float:
    """`row`'s speed-up on a plain frontier, in `units` or `seconds`."""
    points = [(getattr(p, cost), p.loss) for p in frontier]
    if not math.isfinite(row.loss):
        return 0.0
    return speedup(points, row.loss, getattr(row, cost)).ratio


def paired_noise(a: Sequence[float], b: Sequence[float]) -> float:
    """The standard error of the difference of two models' mean eval losses on the same examples."""
    if len(a) != len(b) or len(a) < 2:
        return math.inf
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    n, mean = len(diffs), sum(diffs) / len(diffs)
    return math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1) / n)
