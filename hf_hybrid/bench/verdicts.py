"""From the record's runs to a verdict per method: speed-up at equal eval loss, and whether it is real.

A method's speed-up on a seed is the cost the plain `Trainer` needs to reach the method's final eval loss
(read off that seed's plain frontier: complete runs at 1/4, 1/2, 3/4 and all of the budget, at the best
learning rate) over the cost the method spent — in forward units and in time. The plain runs' own
noise sets the bar: the *seed band* is how far a plain full-budget run of one seed reads from 1.0x on
another seed's frontier (largest over pairs); it needs two seeds or more. A method

- `wins` when every seed reads above 1.0x and above 1 + the seed band,
- `loses` when every seed reads below 1.0x and below 1 − the band (with one seed: below 1 − `ONE_SEED_BAND`),
- `ties` otherwise — including every one-seed reading above 1.0x: one seed cannot show a win.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from .frontier import speedup

BUDGETS = (0.25, 0.5, 0.75, 1.0)
ONE_SEED_BAND = 0.10
NEAR_WIN = 0.9  # a method this close to 1.0x on the first seed gets the other seeds


def runs_of(runs: Iterable[dict[str, Any]], **match: Any) -> list[dict[str, Any]]:
    return [r for r in runs if all(r.get(k) == v for k, v in match.items())]


def best_plain_multiplier(runs: Sequence[dict[str, Any]], seed: int) -> float | None:
    """The sweep's best learning-rate multiplier (lowest final eval loss at the full budget)."""
    sweep = runs_of(runs, role="sweep", seed=seed, budget=1.0)
    finite = [r for r in sweep if r["eval_loss"] == r["eval_loss"]]
    return min(finite, key=lambda r: r["eval_loss"])["lr_multiplier"] if finite else None


def frontier(runs: Sequence[dict[str, Any]], seed: int, multiplier: float) -> list[dict[str, Any]]:
    """The plain runs of `seed` at `multiplier`, one per budget (the sweep's full run included)."""
    plain = [
        r for r in runs if r["method"] == "plain" and r["seed"] == seed and r["lr_multiplier"] == multiplier
    ]
    by_budget = {r["budget"]: r for r in plain}
    return [by_budget[b] for b in BUDGETS if b in by_budget]


def complete(points: Sequence[dict[str, Any]]) -> bool:
    return {p["budget"] for p in points} == set(BUDGETS)


def speedups(points: Sequence[dict[str, Any]], run: dict[str, Any]) -> dict[str, Any]:
    """A run's speed-up (units and time) on a plain frontier, with how each was read."""
    units = speedup([(p["units"], p["eval_loss"]) for p in points], run["eval_loss"], run["units"])
    time = speedup([(p["seconds"], p["eval_loss"]) for p in points], run["eval_loss"], run["seconds"])
    full = next(p for p in points if p["budget"] == 1.0)
    return {
        "seed": run["seed"],
        "speedup_units": units.ratio,
        "speedup_units_kind": units.kind,
        "speedup_time": time.ratio,
        "speedup_time_kind": time.kind,
        "eval_loss": run["eval_loss"],
        "final_loss_delta": run["eval_loss"] - full["eval_loss"],
    }


def seed_band(runs: Sequence[dict[str, Any]], multiplier: float, seeds: Sequence[int]) -> float | None:
    """Largest |speed-up − 1| of one seed's plain full run on another seed's frontier (None: < 2 seeds)."""
    frontiers = {s: frontier(runs, s, multiplier) for s in seeds}
    frontiers = {s: f for s, f in frontiers.items() if complete(f)}
    if len(frontiers) < 2:
        return None
    band = 0.0
    for s, points in frontiers.items():
        for t, other in frontiers.items():
            if s != t:
                full = next(p for p in other if p["budget"] == 1.0)
                band = max(band, abs(speedups(points, full)["speedup_units"] - 1.0))
    return band


def clock_noise(runs: Sequence[dict[str, Any]]) -> float | None:
    """max/min − 1 of the sweep's full-budget run times: they did identical work (the rate changes no
    compute), so this is what a time ratio cannot resolve."""
    times = [r["seconds"] for r in runs_of(runs, role="sweep", budget=1.0) if r["seconds"] > 0]
    return max(times) / min(times) - 1.0 if len(times) >= 2 else None


def judge(per_seed: Sequence[dict[str, Any]], band: float | None) -> tuple[str, str]:
    """(verdict, reason) from the per-seed unit speed-ups and the plain seed band."""
    values = [row["speedup_units"] for row in per_seed]
    if band is None:
        if len(values) == 1 and values[0] < 1.0 - ONE_SEED_BAND:
            return "loses", f"one seed, {values[0]:.2f}x: below 1 - {ONE_SEED_BAND:g}"
        return "ties", f"{len(values)} seed(s) and no plain seed spread: a win needs two seeds or more"
    if all(v > 1.0 + band for v in values):
        return "wins", f"every seed above 1 + the plain seed band ({band:.2f})"
    if all(v < 1.0 - band for v in values):
        return "loses", f"every seed below 1 - the plain seed band ({band:.2f})"
    return "ties", f"within the plain seed band ({band:.2f}) on at least one seed"


def method_runs(runs: Sequence[dict[str, Any]], method: str) -> list[dict[str, Any]]:
    return [r for r in runs if r["method"] == method and r["role"] in ("method", "null")]


def chosen_multiplier(
    runs: Sequence[dict[str, Any]], method: str, seed: int, plain_multiplier: float
) -> float | None:
    """The method's learning rate on the first seed: the one with the best unit speed-up."""
    points = frontier(runs, seed, plain_multiplier)
    candidates = [r for r in method_runs(runs, method) if r["seed"] == seed]
    if not complete(points) or not candidates:
        return None
    return max(candidates, key=lambda r: (speedups(points, r)["speedup_units"], -r["eval_loss"]))[
        "lr_multiplier"
    ]


def verdicts(
    runs: Sequence[dict[str, Any]],
    methods: Sequence[str],
    seeds: Sequence[int],
    parents: dict[str, str] | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(plain summary, one verdict per method) from the runs so far. A null control (`parents`: its
    method) is read at its method's learning rate, next to which it ran on every seed."""
    parents = parents or {}
    first = seeds[0]
    best = best_plain_multiplier(runs, first)
    if best is None:
        return {}, []
    band = seed_band(runs, best, seeds)
    noise = clock_noise(runs)
    plain_full = [p for s in seeds for p in frontier(runs, s, best) if p["budget"] == 1.0]
    losses = [p["eval_loss"] for p in plain_full]
    plain = {
        "best_lr_multiplier": best,
        "seeds": sorted({p["seed"] for p in plain_full}),
        "eval_loss": statistics.median(losses) if losses else None,
        "seed_spread_eval_loss": max(losses) - min(losses) if len(losses) >= 2 else None,
        "seed_band": band,
        "clock_noise": noise,
    }
    out = [
        {
            "method": "plain",
            "lr_multiplier": best,
            "seeds": plain["seeds"],
            "speedup_units": 1.0,
            "speedup_time": 1.0,
            "final_loss_delta": 0.0,
            "verdict": "baseline",
            "reason": "the judge: the plain Trainer at its best learning rate",
        }
    ]
    for method in methods:
        multiplier = chosen_multiplier(runs, parents.get(method, method), first, best)
        if multiplier is None:
            continue
        per_seed = []
        for seed in seeds:
            points = frontier(runs, seed, best)
            run = next(
                (
                    r
                    for r in method_runs(runs, method)
                    if r["seed"] == seed and r["lr_multiplier"] == multiplier
                ),
                None,
            )
            if run is not None and complete(points):
                per_seed.append(speedups(points, run))
        if not per_seed:
            continue
        verdict, reason = judge(per_seed, band)
        time_values = [row["speedup_time"] for row in per_seed]
        time_median = statistics.median(time_values)
        out.append(
            {
                "method": method,
                "lr_multiplier": multiplier,
                "lr_multiplier_of_plain_best": multiplier / best,
                "seeds": [row["seed"] for row in per_seed],
                "speedup_units": statistics.median(row["speedup_units"] for row in per_seed),
                "speedup_time": time_median,
                "speedup_time_within_clock_noise": noise is not None and abs(time_median - 1.0) <= noise,
                "final_loss_delta": statistics.median(row["final_loss_delta"] for row in per_seed),
                "verdict": verdict,
                "reason": reason,
                "per_seed": per_seed,
                "null_control_of": parents.get(method),
            }
        )
    return plain, out
