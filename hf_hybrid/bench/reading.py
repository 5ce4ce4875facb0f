"""A method's points read against plain's: the speed-up at equal eval loss and the band it is read with.

The reading rule and the band are the protocol's (`protocol.py`); this module applies them to rows.
A method's run on each seed is paired with plain's run of that seed at the reading budget (the same eval
examples, the same initialisation and data order): the mean eval-loss difference over the seeds, added
to the first seed's plain loss there, is read on the first seed's plain frontier (up to the reading
budget) as the cost plain needs to get there, over the method's mean cost.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import protocol as rules
from .frontier import speedup
from .protocol import Band
from .rows import RunRow

MIXED = "mixed"  # the invocation of a trunk point whose segments ran in several invocations


@dataclass(frozen=True)
class Evidence:
    """What the rows say about plain: the first seed's frontier, each seed's run at the reading budget,
    and how the eval set is clustered and weighted."""

    frontier: Sequence[RunRow]  # the first seed's points at BUDGETS
    plain_full: Mapping[int, RunRow]  # seed -> plain's run at the reading budget, at its rate
    clusters: Sequence[int] | None = None  # per eval example: its document (None: each its own)
    weights: Sequence[float] | None = None  # per eval example: its tokens (None: equal)
    read_at: float = rules.READ_AT  # the budget every verdict reads (`protocol.reading_budget`)
    price_df: float = math.inf  # of the calibrated prices

    @property
    def first(self) -> int:
        return self.frontier[-1].seed

    @property
    def read(self) -> list[RunRow]:
        """The frontier up to the reading budget: what speed-ups are read on."""
        return [p for p in self.frontier if p.budget <= self.read_at]

    def points(self, cost: str = "units") -> list[tuple[float, float]]:
        return [(getattr(p, cost), p.loss) for p in self.read]

    def at(self, budget: float) -> RunRow:
        """Plain's first-seed frontier point at `budget`."""
        return next(p for p in self.frontier if p.budget == budget)

    @property
    def variance(self) -> float | None:
        return rules.seed_variance([r.loss for r in self.plain_full.values() if math.isfinite(r.loss)])

    @property
    def seed_df(self) -> float:
        return max(1, len(self.plain_full) - 1)

    @property
    def side_by_side(self) -> bool:
        """Plain's frontier and its seeds' runs were all timed in one invocation of the arena."""
        return same_invocation([*self.read, *self.plain_full.values()])


@dataclass(frozen=True)
class Reading:
    speedup: float  # in units
    speedup_time: float | None  # None: the method's and plain's runs were not timed side by side
    kind: str  # how the units were read: interpolated, lower_bound, upper_bound, diverged
    loss_delta: float  # mean over the seeds of the method's eval loss minus plain's at the same budget
    band: Band
    per_seed: list[dict[str, Any]]


def same_invocation(rows: Sequence[RunRow]) -> bool:
    """Whether `rows` were all run by one invocation of the arena (their seconds then compare)."""
    names = {r.invocation for r in rows}
    return len(names) == 1 and None not in names and MIXED not in names


def paired_se(
    a: RunRow, b: RunRow, clusters: Sequence[int] | None = None, weights: Sequence[float] | None = None
) -> float:
    """The eval-cluster standard error of two runs' eval-loss difference, infinite without their
    per-example losses."""
    x, y = a.eval_example_losses, b.eval_example_losses
    if not x or not y or len(x) != len(y):
        return math.inf
    return rules.cluster_bootstrap_se([p - q for p, q in zip(x, y, strict=True)], clusters, weights)


def mean_difference_se(
    pairs: Sequence[tuple[RunRow, RunRow]], clusters: Sequence[int] | None, weights: Sequence[float] | None
) -> float | None:
    """The eval-cluster standard error of the mean over seeds of (method - plain) differences, None when
    a run lacks its per-example losses."""
    lists = [(m.eval_example_losses, p.eval_example_losses) for m, p in pairs]
    if not lists or any(not m or not p or len(m) != len(p) for m, p in lists):
        return None
    diffs = [statistics.fmean(m[i] - p[i] for m, p in lists) for i in range(len(lists[0][0]))]
    return rules.cluster_bootstrap_se(diffs, clusters, weights)


def plain_pair_se(evidence: Evidence) -> float:
    """The eval-cluster standard error of two plain seeds' difference (the median over pairs): how far two
    equally good models' eval losses differ on this eval set by the examples alone."""
    runs = list(evidence.plain_full.values())
    values = [
        paired_se(a, b, evidence.clusters, evidence.weights)
        for i, a in enumerate(runs)
        for b in runs[i + 1 :]
    ]
    values = [v for v in values if math.isfinite(v)]
    return statistics.median(values) if values else math.inf


def slope_se(evidence: Evidence) -> float:
    """The eval-cluster standard error of plain's frontier slope at the reading budget: of the loss
    difference of its last two points, over their log cost ratio (0 where it cannot be measured)."""
    points = evidence.read
    if len(points) < 2:
        return 0.0
    a, b = points[-2], points[-1]
    se = paired_se(a, b, evidence.clusters, evidence.weights)
    if not math.isfinite(se) or not b.units > a.units > 0:
        return 0.0
    return se / math.log(b.units / a.units)


def task_band(
    evidence: Evidence, seeds: int, price: float = 0.0, eval_se: float | None = None, shift: float = 0.0
) -> Band:
    """The band of two equally good methods read over `seeds` seeds: the task's resolution (with a
    method's own `eval_se` and loss difference `shift`, the band its reading has)."""
    points = evidence.points()
    return Band(
        slope=rules.log_slope(points),
        seed_se=rules.seed_se(evidence.variance, seeds),
        eval_se=plain_pair_se(evidence) if eval_se is None else eval_se,
        grid=rules.grid_error(points),
        price=price,
        seed_df=evidence.seed_df,
        price_df=evidence.price_df,
        slope_se=slope_se(evidence),
        shift=shift if math.isfinite(shift) else 0.0,
    )


def read(
    evidence: Evidence,
    rows: Mapping[int, RunRow],
    price: float = 0.0,
    budget: float | None = None,
) -> Reading | None:
    """The method's `rows` (seed -> its point at `budget`, default the reading budget) read on plain's
    frontier; None without the first seed's row. At the reading budget each seed is paired with plain's
    run of that seed; at a shorter budget (the early stop) the first seed's point is read on the frontier
    as it is, and its loss difference is against plain's point at that budget."""
    budget = evidence.read_at if budget is None else budget
    first = evidence.first
    if first not in rows or first not in evidence.plain_full:
        return None
    full = budget == evidence.read_at
    seeds = [s for s in rows if s in evidence.plain_full] if full else [first]
    pairs = [(rows[s], evidence.plain_full[s] if full else evidence.at(budget)) for s in seeds]
    deltas = [m.loss - p.loss for m, p in pairs]
    delta = statistics.fmean(deltas) if all(math.isfinite(d) for d in deltas) else math.inf
    target = evidence.plain_full[first].loss + delta if full else rows[first].loss
    units = statistics.fmean(m.units for m, _ in pairs)
    by_units = speedup(evidence.points("units"), target, units)
    band = task_band(
        evidence, len(seeds), price, mean_difference_se(pairs, evidence.clusters, evidence.weights), delta
    )
    per_seed = [
        {
            "seed": s,
            "eval_loss": m.loss,
            "plain_eval_loss": p.loss,
            "loss_delta": m.loss - p.loss,
            "units": m.units,
        }
        for s, (m, p) in zip(seeds, pairs, strict=True)
    ]
    return Reading(by_units.ratio, _time(evidence, rows, seeds, target), by_units.kind, delta, band, per_seed)


def _time(
    evidence: Evidence, rows: Mapping[int, RunRow], seeds: Sequence[int], target: float
) -> float | None:
    """The speed-up in time, read on plain's frontier in seconds, only where the method's runs and plain's
    were timed in one invocation (a loaded machine's seconds are 3.6x a quiet one's)."""
    mine = [rows[s] for s in seeds]
    if not evidence.side_by_side or not same_invocation([*mine, *evidence.read]):
        return None
    seconds = statistics.fmean(m.seconds for m in mine)
    return speedup(evidence.points("seconds"), target, seconds).ratio if seconds > 0 else None


def same_trajectory(evidence: Evidence, method: RunRow, plain: RunRow) -> dict[str, Any]:
    """A same-trajectory method's short run against plain's at the same rate and budget: does it train
    plain's trajectory (its loss difference within the eval clusters' noise, or worth less than the
    resolution at the reading budget's exchange rate)? Also at one seed, where the resolution is unknown."""
    band = task_band(evidence, seeds=max(1, len(evidence.plain_full)))
    delta = method.loss - plain.loss
    noise = paired_se(method, plain, evidence.clusters, evidence.weights)
    allowed = rules.t_quantile(rules.CONFIDENCE, math.inf) * noise if math.isfinite(noise) else 0.0
    if band.slope > 0 and math.isfinite(band.resolution):
        allowed = max(allowed, band.slope * math.log(band.resolution))
    return {
        "budget": method.budget,
        "eval_loss": method.loss,
        "units": method.units,
        "loss_delta": delta,
        "allowed_loss_delta": allowed,
        "matches": math.isfinite(delta) and abs(delta) <= allowed,
    }
