"""A method's points read against plain's: the speed-up at equal eval loss and the band it is read with.

The reading rule and the band are the protocol's (`protocol.py`); this module applies them to rows.
A method's run on each seed is paired with plain's run of that seed at the full budget (the same eval
examples, the same initialisation and data order): the mean eval-loss difference over the seeds, added
to the first seed's plain full-budget loss, is read on the first seed's plain frontier as the cost plain
needs to get there, over the method's mean cost.
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


@dataclass(frozen=True)
class Evidence:
    """What the rows say about plain: the first seed's frontier, each seed's full-budget run, and how
    the eval set is clustered and weighted."""

    frontier: Sequence[RunRow]  # the first seed's points at BUDGETS
    plain_full: Mapping[int, RunRow]  # seed -> plain's full-budget run at its rate
    clusters: Sequence[int] | None = None  # per eval example: its document (None: each its own)
    weights: Sequence[float] | None = None  # per eval example: its tokens (None: equal)

    @property
    def first(self) -> int:
        return self.frontier[-1].seed

    def points(self, cost: str = "units") -> list[tuple[float, float]]:
        return [(getattr(p, cost), p.loss) for p in self.frontier]

    @property
    def variance(self) -> float | None:
        return rules.seed_variance([r.loss for r in self.plain_full.values() if math.isfinite(r.loss)])


@dataclass(frozen=True)
class Reading:
    speedup: float  # in units
    speedup_time: float
    kind: str  # how the units were read: interpolated, lower_bound, upper_bound, diverged
    loss_delta: float  # mean over the seeds of the method's eval loss minus plain's
    band: Band
    per_seed: list[dict[str, Any]]


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


def task_band(evidence: Evidence, seeds: int, price: float = 0.0, eval_se: float | None = None) -> Band:
    """The band of two equally good methods read over `seeds` seeds: the task's resolution (with a
    method's own `eval_se`, the band its reading has)."""
    points = evidence.points()
    return Band(
        slope=rules.log_slope(points),
        seed_se=rules.seed_se(evidence.variance, seeds),
        eval_se=plain_pair_se(evidence) if eval_se is None else eval_se,
        grid=rules.grid_error(points),
        price=price,
    )


def read(
    evidence: Evidence,
    rows: Mapping[int, RunRow],
    price: float = 0.0,
    budget: float = rules.READ_AT,
) -> Reading | None:
    """The method's `rows` (seed -> its point at `budget`) read on plain's frontier; None without the
    first seed's row. At the full budget each seed is paired with plain's run of that seed; at a shorter
    budget (the early stop) the first seed's point is read on the frontier as it is."""
    first = evidence.first
    if first not in rows or first not in evidence.plain_full:
        return None
    seeds = [s for s in rows if s in evidence.plain_full] if budget == rules.READ_AT else [first]
    pairs = [(rows[s], evidence.plain_full[s]) for s in seeds]
    deltas = [m.loss - p.loss for m, p in pairs]
    delta = statistics.fmean(deltas) if all(math.isfinite(d) for d in deltas) else math.inf
    target = evidence.plain_full[first].loss + delta if budget == rules.READ_AT else rows[first].loss
    units = statistics.fmean(m.units for m, _ in pairs)
    # a seed's clock is read against plain's clock on that seed: plain's first-seed run is a trunk of
    # several processes, another seed's a single run, and the machine's load moves between them
    reference = evidence.plain_full[first].seconds
    seconds = statistics.fmean(
        m.seconds * reference / p.seconds if p.seconds > 0 else m.seconds for m, p in pairs
    )
    by_units = speedup(evidence.points("units"), target, units)
    by_time = speedup(evidence.points("seconds"), target, seconds) if seconds > 0 else by_units
    band = task_band(
        evidence, len(seeds), price, mean_difference_se(pairs, evidence.clusters, evidence.weights)
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
    return Reading(by_units.ratio, by_time.ratio, by_units.kind, delta, band, per_seed)


def same_trajectory(evidence: Evidence, method: RunRow, plain: RunRow, noise: float | None) -> dict[str, Any]:
    """A same-trajectory method's short run against plain's at the same rate and budget: does it train
    plain's trajectory within the task's resolution (its loss difference worth less than the resolution
    at the full budget's exchange rate, or within the eval noise), and its time ratio."""
    band = task_band(evidence, seeds=max(1, len(evidence.plain_full)))
    delta = method.loss - plain.loss
    allowed = rules.Z * paired_se(method, plain, evidence.clusters, evidence.weights)
    if band.slope > 0 and math.isfinite(band.resolution):
        allowed = max(allowed if math.isfinite(allowed) else 0.0, band.slope * math.log(band.resolution))
    ratio = plain.seconds / method.seconds if method.seconds > 0 else 0.0
    word, reason = rules.time_verdict(ratio, noise)
    return {
        "budget": method.budget,
        "loss_delta": delta,
        "allowed_loss_delta": allowed,
        "matches": math.isfinite(delta) and abs(delta) <= allowed,
        "speedup_time": ratio,
        "clock_noise": noise,
        "verdict": word,
        "reason": reason,
    }
