"""From the record's points to a verdict per method: speed-up at equal eval loss, and whether it is real.

A method's speed-up on a seed is the cost the plain `Trainer` needs to reach the method's eval loss —
read off that seed's plain frontier, whose point at each budget is the plain run at that budget's own
tuned rate, and which is read at its best point so far — over the cost the method spent, in forward units
and in time. The method is read at its own best budget (its lowest eval loss on the first seed, each
budget at its race's winner), where its other seeds run too: on a task that overfits, neither side is
charged for training past its best. The plain runs' own noise
sets the bar: the *seed band* is how far one seed's plain full-budget point reads from 1.0x on another
seed's frontier (the largest over pairs). A method

- `wins` when every seed reads above 1.0x and above 1 + the band,
- `loses` when every seed reads below 1 - the band (with one seed: below 1 - `ONE_SEED_BAND`), or it
  was stopped at 1/2 below 1 - 2 x the band,
- `ties` otherwise — including every one-seed reading above 1.0x: one seed cannot show a win.

A same-trajectory method (a compiler, a fused kernel) trains plain's steps: its units are plain's by
construction and its verdict is read in time, against the clock noise (the spread of runs that did
identical work).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from .budget import BUDGETS
from .frontier import speedup
from .plan import ONE_SEED_BAND, Planner, best_point, paired_noise
from .rows import RunRow

__all__ = ["ONE_SEED_BAND", "judge", "verdicts"]


def judge(
    per_seed: Sequence[dict[str, Any]], band: float | None, key: str = "speedup_units"
) -> tuple[str, str]:
    """(verdict, reason) from the per-seed speed-ups and the band (None: one seed)."""
    values = [row[key] for row in per_seed]
    if band is None:
        if len(values) == 1 and values[0] < 1.0 - ONE_SEED_BAND:
            return "loses", f"one seed, {values[0]:.2f}x: below 1 - {ONE_SEED_BAND:g}"
        return "ties", f"{len(values)} seed(s) and no plain seed spread: a win needs two seeds or more"
    if len(values) == 1:
        if values[0] < 1.0 - 2 * band:
            return "loses", f"one seed, {values[0]:.2f}x: below 1 - twice the band ({band:.2f})"
        return "ties", f"one seed, {values[0]:.2f}x: a win needs every seed above 1 + the band ({band:.2f})"
    if all(v > 1.0 + band and v > 1.0 for v in values):
        return "wins", f"every seed above 1 + the band ({band:.2f})"
    if all(v < 1.0 - band for v in values):
        return "loses", f"every seed below 1 - the band ({band:.2f})"
    return "ties", f"within the band ({band:.2f}) on at least one seed"


def reading(frontier: Sequence[RunRow], row: RunRow) -> dict[str, Any]:
    """A row's speed-up on a plain frontier, in units and time, with how each was read."""
    out: dict[str, Any] = {
        "seed": row.seed,
        "budget": row.budget,
        "lr_multiplier": row.lr_multiplier,
        "eval_loss": row.eval_loss,
    }
    for cost, name in (("units", "speedup_units"), ("seconds", "speedup_time")):
        if not math.isfinite(row.loss):
            out[name], out[f"{name}_kind"] = 0.0, "diverged"
            continue
        value = speedup([(getattr(p, cost), p.loss) for p in frontier], row.loss, getattr(row, cost))
        out[name], out[f"{name}_kind"] = value.ratio, value.kind
    same_budget = next(p for p in frontier if p.budget == row.budget)
    out["loss_delta"] = row.loss - same_budget.loss if math.isfinite(row.loss) else math.inf
    return out


def clock_noise(planner: Planner) -> float | None:
    """max/min - 1 of the plain full-budget points' times, every rate and seed: identical work (the rate
    changes no compute), so what a time ratio cannot resolve."""
    times = [
        r.seconds
        for r in planner.rows
        if r.method == "plain" and r.point and r.budget == 1.0 and r.key in planner.used and r.seconds > 0
    ]
    return max(times) / min(times) - 1.0 if len(times) >= 2 else None


def eval_noise_band(planner: Planner) -> float | None:
    """The part of the seed band that eval noise alone explains: a frontier's best point moved by twice
    the paired standard error of two seeds' eval losses (same examples, measured at the full budget,
    where the per-example losses are kept), read on that frontier."""
    seeds = [s for s in planner.protocol.seeds if planner.frontier(s) is not None]
    out = None
    for s in seeds:
        for t in seeds:
            a, frontier = planner.frontier(s)[-1], planner.frontier(t)
            b = frontier[-1]
            if s == t or not a.eval_example_losses or not b.eval_example_losses:
                continue
            noise = paired_noise(a.eval_example_losses, b.eval_example_losses)
            points = [(p.units, p.loss) for p in frontier]
            best = best_point(frontier)
            part = abs(speedup(points, best.loss + 2 * noise, best.units).ratio - 1.0)
            out = part if out is None else max(out, part)
    return out


def verdicts(planner: Planner, parents: dict[str, str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(plain summary, one verdict per method) from a complete plan's points. `parents`: each null
    control's method, whose rate it was read at."""
    d = planner.decisions
    first = planner.first
    if not d.best or planner.frontier(first) is None:
        return {}, []
    band = d.band if len(planner.protocol.seeds) > 1 else None
    noise = clock_noise(planner)
    full = [planner.frontier(s)[-1] for s in planner.protocol.seeds if planner.frontier(s) is not None]
    losses = [p.loss for p in full]
    plain = {
        "best_lr_multiplier": {str(b): d.best[b] for b in BUDGETS},
        "best_budget": best_point(planner.frontier(first)).budget,
        "untuned": {str(b): why for b, why in d.untuned.items()},
        "seeds": [p.seed for p in full],
        "eval_loss": statistics.median(losses),
        "seed_spread_eval_loss": max(losses) - min(losses) if len(losses) >= 2 else None,
        "seed_band": band,
        "seed_band_eval_noise": eval_noise_band(planner),
        "clock_noise": noise,
        "mode": d.mode,
    }
    out = [
        {
            "method": "plain",
            "lr_multiplier": d.best[1.0],
            "seeds": plain["seeds"],
            "speedup_units": 1.0,
            "speedup_time": 1.0,
            "final_loss_delta": 0.0,
            "verdict": "baseline",
            "reason": "the judge: the plain Trainer at each budget's best learning rate",
        }
    ]
    for method in [*planner.methods, *planner.nulls.values()]:
        row = _verdict(planner, method, parents.get(method.spec), band, noise)
        if row is not None:
            out.append(row)
    return plain, out


def _verdict(planner: Planner, method: Any, parent: str | None, band: float | None, noise: float | None):
    d = planner.decisions
    chosen = d.methods.get(parent or method.spec, {})
    rate = chosen.get("lr_multiplier")
    if rate is None:
        return None
    if method.same_trajectory:
        return _same_trajectory(planner, method, rate, noise)
    per_seed, curve = _readings(planner, method, parent, chosen)
    stopped = chosen.get("stopped_at")
    if stopped is not None and curve:
        at = next(r for r in curve if r["budget"] == stopped)
        per_seed = [at]
        verdict = "loses"
        reason = f"stopped at {stopped:g}: {at['speedup_units']:.2f}x, below 1 - 2 x the band"
    elif not per_seed:
        return None
    else:
        verdict, reason = judge(per_seed, band)
    if chosen.get("provably_plain"):
        verdict, reason = "ties", f"the plain runs, reused: {chosen['provably_plain']}"
    if d.untuned:
        reason += "; the judge is not tuned at " + ", ".join(f"{b:g}" for b in d.untuned)
    times = [r["speedup_time"] for r in per_seed]
    return {
        "method": method.spec,
        "lr_multiplier": rate,
        "lr_multiplier_of_plain_best": rate / d.best[1.0],
        "seeds": [r["seed"] for r in per_seed],
        "budget": per_seed[0]["budget"],
        "speedup_units": statistics.median(r["speedup_units"] for r in per_seed),
        "speedup_time": statistics.median(times),
        "speedup_time_within_clock_noise": noise is not None and abs(statistics.median(times) - 1) <= noise,
        "final_loss_delta": statistics.median(r["loss_delta"] for r in per_seed),
        "verdict": verdict,
        "reason": reason,
        "judge_tuned": not d.untuned,
        "stopped_at": stopped,
        "per_seed": per_seed,
        "curve": curve,
        "null_control_of": parent,
        "same_trajectory": False,
    }


def _readings(
    planner: Planner, method: Any, parent: str | None, chosen: dict[str, Any]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(each seed's reading at the budget the verdict reads, the first seed's at every budget): the
    method's points at each budget's own race winner, a null's at its parent's verdict rate."""
    rate, read_at = chosen["lr_multiplier"], chosen.get("read_at", 1.0)
    per_seed, curve = [], []
    for seed in planner.protocol.seeds:
        frontier = planner.frontier(seed)
        if frontier is None:
            continue
        for budget in BUDGETS if seed == planner.first else (read_at,):
            if parent is None:
                at = chosen.get("lr_multiplier_by_budget", {}).get(str(budget), rate)
                row = planner.point(method.spec, seed, at, budget)
            else:
                row = planner.null_point(method, parent, seed, rate, budget)
            if row is None:
                continue
            read = reading(frontier, row)
            if seed == planner.first:
                curve.append(read)
            if budget == read_at:
                per_seed.append(read)
    return per_seed, curve


def _same_trajectory(
    planner: Planner, method: Any, rate: float, noise: float | None
) -> dict[str, Any] | None:
    per_seed = []
    for seed in planner.protocol.seeds:
        row = planner.point(method.spec, seed, rate, 1.0)
        plain = planner.point("plain", seed, rate, 1.0)
        if row is None or plain is None:
            continue
        per_seed.append(
            {
                "seed": seed,
                "budget": 1.0,
                "eval_loss": row.eval_loss,
                "speedup_units": 1.0,
                "speedup_units_kind": "same_trajectory",
                "speedup_time": plain.seconds / row.seconds if row.seconds > 0 else 0.0,
                "speedup_time_kind": "same_trajectory",
                "loss_delta": row.loss - plain.loss,
            }
        )
    if not per_seed:
        return None
    verdict, reason = judge(per_seed, noise, key="speedup_time")
    reason = "same trajectory, judged in time against the clock noise: " + reason
    times = [r["speedup_time"] for r in per_seed]
    return {
        "method": method.spec,
        "lr_multiplier": rate,
        "lr_multiplier_of_plain_best": 1.0,
        "seeds": [r["seed"] for r in per_seed],
        "budget": 1.0,
        "speedup_units": 1.0,
        "speedup_time": statistics.median(times),
        "speedup_time_within_clock_noise": noise is not None and abs(statistics.median(times) - 1) <= noise,
        "final_loss_delta": statistics.median(r["loss_delta"] for r in per_seed),
        "verdict": verdict,
        "reason": reason,
        "judge_tuned": not planner.decisions.untuned,
        "stopped_at": None,
        "per_seed": per_seed,
        "curve": [],
        "null_control_of": None,
        "same_trajectory": True,
    }
