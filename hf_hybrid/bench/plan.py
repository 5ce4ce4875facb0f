"""The protocol (`protocol.py`) applied to a record: which runs are needed next.

`Planner(...).plan()` reads the rows and returns every spec whose inputs are known and whose row is not in
the record yet, and the decisions so far. It is called again after every finished run, so a killed and
rerun arena takes the same decisions and runs the same specs as an uninterrupted one: nothing but the
record decides (eval losses and units; times never decide a run).

Each stage is a small step from the record to a decision: it returns what it decided (or None while a
point it needs is missing) and adds what it needs to the plan. The stages, each starting as soon as its
inputs are decided so that workers are not left idle:

1. the base rate (a range test when the task has none);
2. plain's race on the first seed: its frontier's rate at every budget (`protocol.race`);
3. once the full budget's rate is known, beside each other: the schedule check, the other seeds' plain
   runs of the full budget, and every method (its own race, its early stop, its other seeds, its null).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from . import protocol as rules
from . import reading
from .budget import Budgets
from .chains import Chains
from .methods import Method
from .protocol import BUDGETS, READ_AT, Protocol, Race
from .range_test import range_test_spec, suggested_rate
from .rows import Rows, RunRow
from .spec import RunSpec

PREDICT = "predict"


@dataclass
class Decisions:
    """What the protocol decided (written to the record for the report and verdicts)."""

    base_learning_rate: float | None = None
    mode: str = "wsd"
    plain: dict[str, Any] = field(default_factory=dict)  # plain's race
    schedule_check: dict[str, Any] = field(default_factory=dict)
    read_at: float | None = None  # the budget every verdict reads (`protocol.reading_budget`)
    methods: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def best(self) -> dict[float, float]:
        return {float(b): r for b, r in self.plain.get("best", {}).items()}

    @property
    def untuned(self) -> dict[float, str]:
        return {float(b): why for b, why in self.plain.get("untuned", {}).items()}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Plan:
    specs: list[RunSpec]  # ready to run now
    rebuild: list[RunSpec]  # recorded segments to run again: a ready spec needs their missing checkpoint
    reuse: list[tuple[RunSpec, str]]  # specs that provably train like a recorded run (its key)
    doomed: list[tuple[RunSpec, str]]  # specs that cannot run: what they continue failed (why)
    decisions: Decisions
    used: set[str]  # every recorded key the plan stands on (the rest is no longer part of it)
    complete: bool


def interleaved(specs: list[RunSpec]) -> list[RunSpec]:
    """The ready specs with the timed runs last, round by round (`repeat`), plain first in each round:
    the executor hands them out in this order, so a round's runs share the machine's load."""
    timed = sorted((s for s in specs if s.repeat), key=lambda s: (s.repeat, s.method != "plain", s.method))
    return [s for s in specs if not s.repeat] + timed


class Planner(Chains):
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
        eval_clusters: Sequence[int] | None = None,
        eval_weights: Sequence[float] | None = None,
        price_errors: dict[str, float] | None = None,
        price_df: float = math.inf,
    ) -> None:
        super().__init__(
            budgets, rows, methods, nulls, base_learning_rate, task_schedule, out, protocol.schedule
        )
        self.protocol = protocol
        self.clusters, self.weights = eval_clusters, eval_weights
        self.price_errors = dict(price_errors or {})
        self.price_df = price_df
        self.decisions = Decisions(mode=protocol.schedule)
        self.first = protocol.seeds[0]

    # ---- the stages ------------------------------------------------------------------------------------

    def plan(self) -> Plan:
        if self._base_rate() is not None:
            plain = self._plain_race()
            if plain.decided:
                if self._schedule_check():
                    plain = self._plain_race()  # again, in separate runs of the task's own schedule
                if plain.decided and self._reading_budget() is not None:
                    # the run-to-run noise, and the plain run each method's seed is paired with
                    rate = self.plain_rate
                    others = [self.run_spec("plain", s, rate, self.read_at) for s in self.protocol.seeds[1:]]
                    self._need(others)
                    for method in self.methods:
                        self._method(method)
        complete = not self.waiting and not self.ready and not self.reuse and not self.doomed
        return Plan(
            interleaved(list(self.ready.values())),
            list(self.rebuild.values()),
            list(self.reuse.values()),
            list(self.doomed.values()),
            self.decisions,
            self.used,
            complete,
        )

    def _reading_budget(self) -> float | None:
        """The budget every verdict reads, from plain's first-seed frontier alone, once it is complete."""
        frontier = self.frontier()
        if frontier is None:
            return None
        self.decisions.read_at = rules.reading_budget([(p.budget, p.loss) for p in frontier])
        return self.decisions.read_at

    @property
    def read_at(self) -> float:
        return self.decisions.read_at or READ_AT

    def _base_rate(self) -> float | None:
        """The races' centre: the task's rate, or a range test's (looked up even once its rate is in the
        record, so that the plan stands on it and plain's part counts its cost). The centre the range test
        gave when it ran is the one kept, so a record resumed after the rule changed keeps its races."""
        spec = range_test_spec(self.budgets, self.first)
        row = self._row(spec)
        if self.base is None:
            if row is None:
                self._want([spec])
                return None
            self.base = row.details.get("centre") or suggested_rate(row.losses, row.stop)
        self.decisions.base_learning_rate = self.base
        return self.base

    def _plain_race(self) -> Race:
        state = self.race("plain", rules.first_grid(1.0, self.protocol.lr_multipliers))
        self.decisions.plain = state.to_dict()
        self._want([self.point_spec("plain", self.first, r, b) for r, b in state.wanted])
        if state.decided:  # the frontier's point at every budget, at that budget's rate
            self._need([self.point_spec("plain", self.first, state.best[b], b) for b in BUDGETS])
        return state

    def race(self, method: str, grid: Sequence[float]) -> Race:
        """`protocol.race` on the first seed's points of `method`."""

        def loss_at(rate: float, budget: float) -> float | None:
            row = self.point(method, self.first, rate, budget)
            return None if row is None else row.loss

        def paired_se(rate: float, other: float, budget: float) -> float:
            rows = self.point(method, self.first, rate, budget), self.point(method, self.first, other, budget)
            return math.inf if None in rows else self.paired_se(*rows)

        return rules.race(grid, loss_at, self.protocol.widen, paired_se)

    def _schedule_check(self) -> bool:
        """The trunk's branch at `SCHEDULE_CHECK_AT` against a run of that budget in the task's own schedule
        at the same rate (half a run, where the full budget would cost a whole one); True when the
        trunk is worse beyond `Z` paired standard errors (every run then falls back to separate runs)."""
        if self.protocol.schedule != "wsd" or not self.protocol.schedule_check:
            return False
        at = rules.SCHEDULE_CHECK_AT
        rate = self.decisions.best[at]
        trunk = self.point("plain", self.first, rate, at, "wsd")
        own_spec = self._separate_spec("plain", self.first, rate, at, own=True)
        own = self._row(own_spec)
        if trunk is not None and not trunk.eval_example_losses:  # recorded before the check read it
            self._want([self.point_spec("plain", self.first, rate, at, "wsd")])
            trunk = None
        if trunk is None or own is None:
            self._need([own_spec])
            return False
        difference = trunk.loss - own.loss
        noise = self.paired_se(trunk, own)
        fallback = difference > rules.Z * noise
        self.decisions.schedule_check = {
            "schedule": self.task_schedule.get("lr_scheduler_type"),
            "lr_multiplier": rate,
            "budget": at,
            "trunk_eval_loss": trunk.loss,
            "own_schedule_eval_loss": own.loss,
            "paired_eval_se": noise,
            "fallback": fallback,
        }
        if fallback and self.mode != "separate":
            self.mode = self.decisions.mode = "separate"
            return True
        return False

    def paired_se(self, a: RunRow, b: RunRow) -> float:
        """The eval-cluster standard error of two runs' eval-loss difference (same examples)."""
        return reading.paired_se(a, b, self.clusters, self.weights)

    def evidence(self, all_seeds: bool = False) -> reading.Evidence | None:
        """Plain's frontier and full-budget runs so far (None while the frontier is incomplete; with
        `all_seeds`, also while a seed's full-budget run is missing)."""
        frontier = self.frontier()
        if frontier is None or self._reading_budget() is None:
            return None
        full = {s: self.full_point("plain", s, self.plain_rate) for s in self.protocol.seeds}
        if all_seeds and any(r is None for r in full.values()):
            return None
        return reading.Evidence(
            frontier,
            {s: r for s, r in full.items() if r is not None},
            self.clusters,
            self.weights,
            self.read_at,
            self.price_df,
        )

    def kinds(self, method: str) -> list[str]:
        """The kinds of step `method`'s runs took (what its price error is made of)."""
        return sorted({k for r in self.rows if r.method == method for k in r.step_counts})

    def price_error(self, method: str) -> float:
        """The log-cost error of `method`'s price against plain's (`protocol.price_error`)."""
        return rules.price_error(self.price_errors, self.kinds(method), self.kinds("plain"))

    # ---- a method ------------------------------------------------------------------------------------

    def _method(self, method: Method) -> None:
        record: dict[str, Any] = self.decisions.methods.setdefault(method.spec, {})
        plain_rate = self.plain_rate
        reason = method.provably_plain(self.budgets.max_steps)
        if reason is not None:
            self._provably_plain(method, plain_rate, reason, record)
            return
        if method.same_trajectory and self._same_trajectory(method, plain_rate, record):
            return
        state = self.race(
            method.spec, rules.first_grid(plain_rate * method.rate_scale, self.protocol.lr_multipliers)
        )
        record["race"] = state.to_dict()
        self._want([self._method_point(method, r, b) for r, b in state.wanted])
        if not state.decided:
            return
        record["lr_multiplier"] = state.rate
        evidence = self.evidence(all_seeds=True)
        if evidence is None:
            self.waiting = True
            return
        half = self.point(method.spec, self.first, state.rate, rules.EARLY_STOP_AT)
        early = None
        if self.read_at > rules.EARLY_STOP_AT:
            early = reading.read(
                evidence, {self.first: half}, self.price_error(method.spec), rules.EARLY_STOP_AT
            )
        if early is not None and rules.stops_early(early.speedup, early.band):
            record["stopped_at"] = rules.EARLY_STOP_AT
            self._null(method, state.rate, [self.first], rules.EARLY_STOP_AT)
            return
        self._more_seeds(method, state.rate, record, evidence)

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

    def _more_seeds(
        self, method: Method, rate: float, record: dict[str, Any], evidence: reading.Evidence
    ) -> None:
        """The reading budget on the first seed; the other seeds where they can change the verdict."""
        if not self._need([self._method_point(method, rate, self.read_at)]):
            return
        self._null(method, rate, [self.first], self.read_at)
        others = list(self.protocol.seeds[1:])
        if not others:
            return
        full = self.full_point(method.spec, self.first, rate)
        one = reading.read(evidence, {self.first: full}, self.price_error(method.spec))
        every = reading.task_band(evidence, seeds=len(self.protocol.seeds), price=one.band.price)
        if not rules.more_seeds_can_change(one.speedup, one.band, every):
            record["other_seeds"] = "not run: they cannot change the one-seed verdict"
            return
        record["other_seeds"] = "run: the one-seed reading may change"
        self._need([self.run_spec(method.spec, seed, rate, self.read_at) for seed in others])
        self._null(method, rate, others, self.read_at)

    def _provably_plain(self, method: Method, rate: float, reason: str, record: dict[str, Any]) -> None:
        """A method that trains exactly like plain here: its full-budget points are plain's, reused, never
        run (nor its null's)."""
        record.update(lr_multiplier=rate, provably_plain=reason)
        for seed in self.protocol.seeds:
            spec = self.run_spec(method.spec, seed, rate, self.read_at)
            twin = self.point("plain", seed, rate, self.read_at)
            if self._row(spec) is None and twin is not None:
                self.reuse.setdefault(spec.key, (spec, twin.key))
        self._null(method, rate, self.protocol.seeds, self.read_at)

    def _same_trajectory(self, method: Method, rate: float, record: dict[str, Any]) -> bool:
        """A short run at plain's rate against plain's point of that budget: True when it trains plain's
        trajectory within the eval noise (then judged in time, `_timed`); False sends it to the race."""
        short = rules.SAME_TRAJECTORY_BUDGET
        mine = self.run_spec(method.spec, self.first, rate, short)
        theirs = self.point("plain", self.first, rate, short)
        evidence = self.evidence(all_seeds=True)
        wanted = [mine] if theirs is not None else [mine, self.run_spec("plain", self.first, rate, short)]
        if not self._need(wanted) or evidence is None:
            self.waiting = True
            return True
        theirs = theirs or self._row(wanted[1])
        check = reading.same_trajectory(evidence, self._row(mine), theirs)
        record.update(lr_multiplier=rate, same_trajectory=check)
        if check["matches"]:
            check["timing"] = self._timed(method, rate)
        return check["matches"]

    def _timed(self, method: Method, rate: float) -> dict[str, Any] | None:
        """`TIMED_PAIRS` pairs of timed runs (plain's, the method's) of the short budget, each pair run by
        one invocation; all asked for at once and handed out round by round (`interleaved`), so the two
        sides share the machine's moods. A pair split across invocations (a killed arena) does not count:
        another pair is asked for. None until every pair is recorded."""
        pairs: list[tuple[RunRow, RunRow]] = []
        wanted: list[RunSpec] = []
        repeat = 0
        while len(pairs) + len(wanted) // 2 < rules.TIMED_PAIRS:
            repeat += 1
            specs = [self._timing_spec(name, rate, repeat) for name in ("plain", method.spec)]
            rows = [self._row(spec) for spec in specs]
            if None in rows:
                wanted += specs
            elif reading.same_invocation(rows):
                pairs.append((rows[0], rows[1]))
        if not self._need(wanted):
            return None
        timed = rules.timing([(p.seconds, m.seconds) for p, m in pairs])
        word, reason = rules.time_verdict(timed)
        return {
            **(timed.to_dict() if timed else {}),
            "repeats": [p.spec["repeat"] for p, _ in pairs],
            "verdict": word,
            "reason": reason,
        }

    def _timing_spec(self, method: str, rate: float, repeat: int) -> RunSpec:
        """A timed run of the short budget that is not evaluated (`repeat` > 0 keeps it apart from the
        evaluated run of the same budget)."""
        spec = self.run_spec(method, self.first, rate, rules.SAME_TRAJECTORY_BUDGET)
        return replace(spec, evaluate=False, per_example=False, repeat=repeat)

    def _null(self, method: Method, rate: float, seeds: Sequence[int], budget: float) -> None:
        """The null control replays each of the method's runs at `rate` that the verdict reads (`budget`
        on `seeds`), as itself (a uniform draw for selective backprop) or replaying its phases (a hybrid
        run's); where a hybrid run predicted nothing on a seed, its null there is the plain run, reused."""
        null = self.nulls.get(method.spec)
        if null is None:
            return
        parents = [
            r
            for r in self.rows.points(method.spec)
            if r.seed in seeds and r.lr_multiplier == rate and r.budget == budget
        ]
        points = []
        for parent in sorted(parents, key=lambda r: (r.seed, r.kind)):
            self.used.add(parent.key)
            spec = self.replay_spec(null, parent)
            if self._row(spec) is not None:
                continue
            twin = self._plain_twin(method, parent) if null.replays_parent else None
            if twin is not None:
                self.reuse.setdefault(spec.key, (spec, twin.key))
                continue
            points.append(spec)
        self._need(points)

    def _plain_twin(self, method: Method, parent: RunRow) -> RunRow | None:
        """The plain row that trains exactly like the null of `parent`, when the parent's run predicted
        nothing (its whole trunk on that seed, for a branch)."""
        if parent.reused_from is not None:
            return self.rows.get(parent.reused_from)
        family = [r for r in self.rows if r.method == method.spec and r.seed == parent.seed]
        if any(PREDICT in (r.details.get("phases") or ()) for r in family):
            return None
        spec = RunSpec.from_dict({**parent.spec, "method": "plain", "replays": None, "replay": None})
        return self.rows.get(spec.key)

    @property
    def plain_rate(self) -> float | None:
        """Plain's rate at the reading budget (the race's winner unless plain's curve turned up at 1/4)."""
        return self.decisions.best.get(self.read_at)

    def frontier(self) -> list[RunRow] | None:
        """Plain's points on the first seed at each budget's rate, or None while one is missing."""
        best = self.decisions.best
        if any(b not in best for b in BUDGETS):
            return None
        points = [self.point("plain", self.first, best[b], b) for b in BUDGETS]
        return None if any(p is None for p in points) else points

    def full_point(self, method: str, seed: int, rate: float) -> RunRow | None:
        """A method's row at the reading budget on `seed` (its trunk's point on the first seed, a run on the
        others)."""
        return self.point(method, seed, rate, self.read_at)
