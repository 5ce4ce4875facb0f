"""From a complete plan's points to the record's verdicts: plain's summary (its resolution, what it cost)
and one verdict per method, by the protocol's reading rule and band (`protocol.py`, `reading.py`).

A same-trajectory method (a compiler, a fused kernel, padding removed) that trained plain's trajectory
within the eval noise is judged in time on interleaved timed pairs; every other method by its speed-up at
equal eval loss at the reading budget, against its band.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import protocol as rules
from . import reading
from .budget import WSD
from .frontier import speedup
from .plan import Planner
from .protocol import BUDGETS, SAME_TRAJECTORY_BUDGET
from .rows import RunRow
from .spec import RANGE_TEST, SEGMENT, SEPARATE, RunSpec

__all__ = ["costs", "verdicts"]

SAME_TRAJECTORY_REFERENCE = "same_trajectory_reference"  # plain's run timed beside a same-trajectory method's


def verdicts(planner: Planner, parents: dict[str, str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(plain summary, one verdict per method) from a complete plan's points. `parents`: each null
    control's method, whose rate it is read at."""
    evidence = planner.evidence()
    if evidence is None or planner.first not in evidence.plain_full:
        return {}, []
    cost = costs(planner)
    plain = _plain(planner, evidence, cost)
    out = [
        {
            "method": "plain",
            "lr_multiplier": planner.plain_rate,
            "seeds": sorted(evidence.plain_full),
            "speedup_units": 1.0,
            "speedup_time": 1.0,
            "loss_delta": 0.0,
            "verdict": "baseline",
            "reason": "the judge: the plain Trainer, its rate raced as every method's is",
            "cost_plain_runs": cost["plain"]["total"],
        }
    ]
    for method in [*planner.methods, *planner.nulls.values()]:
        row = _verdict(planner, evidence, method, parents.get(method.spec), cost)
        if row is not None:
            out.append(row)
    return plain, out


def _plain(planner: Planner, evidence: reading.Evidence, cost: dict[str, Any]) -> dict[str, Any]:
    seeds = len(evidence.plain_full)
    band = reading.task_band(evidence, seeds=seeds)
    losses = {str(s): r.loss for s, r in evidence.plain_full.items()}
    return {
        "best_lr_multiplier": {str(b): planner.decisions.best[b] for b in BUDGETS},
        "untuned": {str(b): why for b, why in planner.decisions.untuned.items()},
        "seeds": sorted(evidence.plain_full),
        "eval_loss": statistics.median(losses.values()),
        "eval_loss_by_seed": losses,
        "read_at": planner.read_at,
        "resolution": {
            "seeds": seeds,
            "eval_clusters": len(set(evidence.clusters)) if evidence.clusters else None,
            **band.to_dict(),
            "target": rules.TARGET_RESOLUTION,
            **_what_reaches_target(band, evidence.variance),
        },
        "mode": planner.decisions.mode,
        "cost_plain_runs": cost["plain"],
    }


def _what_reaches_target(band: rules.Band, variance: float | None) -> dict[str, Any]:
    """More seeds or more eval clusters alone, and both together only where neither alone reaches it."""
    seeds, factor = rules.seeds_for(band, variance), rules.eval_factor_for(band)
    found: dict[str, Any] = {"seeds_for_target": seeds, "eval_factor_for_target": factor}
    if band.slope > 0 and not seeds and not factor:
        pairs = rules.seeds_and_eval_for(band, variance)
        if pairs:
            found["seeds_and_eval_for_target"] = [list(p) for p in pairs]
    return found


def _verdict(
    planner: Planner, evidence: reading.Evidence, method: Any, parent: str | None, cost: dict[str, Any]
) -> dict[str, Any] | None:
    chosen = planner.decisions.methods.get(parent or method.spec, {})
    rate = chosen.get("lr_multiplier")
    if rate is None:
        return None
    base = {
        "method": method.spec,
        "lr_multiplier": rate,
        "lr_multiplier_of_plain": rate / planner.plain_rate,
        "null_control_of": parent,
        "cost_plain_runs": cost["methods"].get(parent or method.spec, 0.0),
        "notes": sorted({r.note for r in planner.rows if r.method == method.spec and r.note}),
    }
    check = chosen.get("same_trajectory")
    if check is not None and check["matches"] and parent is None:
        return {**base, **_same_trajectory(check)}
    budget = chosen.get("stopped_at") or planner.read_at
    rows = {s: _point(planner, method, parent, s, rate, budget) for s in planner.protocol.seeds}
    rows = {s: r for s, r in rows.items() if r is not None}
    read = reading.read(evidence, rows, planner.price_error(method.spec), budget)
    if read is None:
        return None
    word, reason = rules.verdict(read.speedup, read.band, _untuned(planner, chosen), chosen.get("stopped_at"))
    if read.speedup_time is None:
        reason += "; no time speed-up: its runs and plain's were not timed in one invocation"
    if chosen.get("provably_plain"):
        word, reason = rules.TIES, f"the plain runs, reused: {chosen['provably_plain']}"
    idle = never_engaged(list(rows.values()))
    if idle:
        reason += f"; its mechanism never engaged: {idle}"
    width = read.band.half_width(with_seeds=read.band.known)
    return {
        **base,
        "seeds": sorted(rows),
        "budget": budget,
        "speedup_units": read.speedup,
        "speedup_units_kind": read.kind,
        "speedup_time": read.speedup_time,
        "loss_delta": read.loss_delta,
        "band": {**read.band.to_dict(), "low": math.exp(-width), "high": math.exp(width)},
        "verdict": word,
        "reason": reason,
        "engaged": idle is None,
        "stopped_at": chosen.get("stopped_at"),
        "never_reaches_plain": _never_reaches(read),
        "per_seed": read.per_seed,
        "curve": _curve(planner, evidence, method, parent, chosen),
        "same_trajectory": False,
    }


def _untuned(planner: Planner, chosen: dict[str, Any]) -> str | None:
    """Why the rate that decides the full budget sits at an edge, on either side (None: tuned)."""
    last = rules.RACE_RUNGS[-1]
    if last in planner.decisions.untuned:
        return f"plain is untuned at {last:g} ({planner.decisions.untuned[last]})"
    mine = chosen.get("race", {}).get("untuned", {}).get(str(last))
    return f"its race is untuned at {last:g} ({mine})" if mine else None


def _never_reaches(read: reading.Reading) -> bool:
    """A win read at a worse loss than plain's: it reaches plain's frontier only at its own loss, and plain
    at the same steps gives a better model."""
    return read.speedup > 1 and read.loss_delta > 0


def _same_trajectory(check: dict[str, Any]) -> dict[str, Any]:
    timing = check.get("timing") or {}
    return {
        "seeds": [0],
        "budget": check["budget"],
        "speedup_units": 1.0,
        "speedup_units_kind": "same_trajectory",
        "speedup_time": timing.get("ratio"),
        "loss_delta": check["loss_delta"],
        "band": {"low": timing.get("low"), "high": timing.get("high")},
        "timing": timing,
        "verdict": timing.get("verdict", rules.UNRESOLVED),
        "reason": "same trajectory within the eval noise, judged in time: "
        + timing.get("reason", "its timed pairs are not all recorded yet"),
        "engaged": True,
        "stopped_at": None,
        "per_seed": [],
        "curve": [
            {"budget": check["budget"], "eval_loss": check.get("eval_loss"), "units": check.get("units")}
        ]
        if check.get("units")
        else [],
        "same_trajectory": True,
    }


def _curve(
    planner: Planner, evidence: reading.Evidence, method: Any, parent: str | None, chosen: dict[str, Any]
) -> list[dict[str, Any]]:
    """The first seed's point at every budget it reached (at the race's rate there), read on the
    frontier as it is: what the plot draws."""
    out = []
    best = {float(b): r for b, r in chosen.get("race", {}).get("best", {}).items()}
    for budget in BUDGETS:
        rate = best.get(budget, chosen["lr_multiplier"])
        row = _point(planner, method, parent, planner.first, rate, budget)
        if row is None or row.eval_loss is None:
            continue
        units = speedup(evidence.points("units"), row.loss, row.units) if row.units > 0 else None
        out.append(
            {
                "budget": budget,
                "lr_multiplier": rate,
                "eval_loss": row.loss,
                "units": row.units,
                "speedup_units": units.ratio if units else 0.0,
                "speedup_units_kind": units.kind if units else "diverged",
            }
        )
    return out


def _point(
    planner: Planner, method: Any, parent: str | None, seed: int, rate: float, budget: float
) -> RunRow | None:
    """A method's point, or a null control's replay of its `parent`'s."""
    if parent is None:
        return planner.point(method.spec, seed, rate, budget)
    return planner.null_point(method, parent, seed, rate, budget)


def never_engaged(read: list[RunRow]) -> str | None:
    """The note of the rows a verdict reads when every one of them says its mechanism never acted (each
    row's note covers its run from step 0); None when one of them did. Notes of other runs (an early
    segment that ended inside the warmup) say nothing about the runs read."""
    if read and all(r.note for r in read):
        return read[0].note
    return None


def own_units(planner: Planner, row: RunRow) -> float:
    """What a row itself computed: its units from step 0 less those of the recorded segment it resumed
    from (found among the rows, so that a method no longer in the plan is still costed)."""
    if row.reused_from is not None or row.failed:
        return 0.0
    if row.start == 0:
        return row.units
    trunk = _trunk_name(row)
    before = [
        r
        for r in planner.rows
        if r.kind == SEGMENT and _trunk_name(r) == trunk and r.spec["stop"] == row.start
    ]
    return row.units - (before[0].units if trunk and before else 0.0)


def _trunk_name(row: RunRow) -> str | None:
    """The trunk a row continues, by its folder's name: a record moved or resumed under another `--out`
    holds the same trunk at two paths."""
    trunk = row.spec.get("trunk_dir")
    return Path(trunk).name if trunk else None


def costs(planner: Planner) -> dict[str, Any]:
    """The record's compute in plain full runs: plain's part (its race, the schedule check, the other
    seeds, a range test), each method's (with its null control's), and the runs no longer used. Plain's
    runs timed beside same-trajectory methods exist only for them: they are those methods' cost, shared.
    A method judged in time is costed by its time against those runs (`timed_cost`), not by its price."""
    full = planner.full_point("plain", planner.first, planner.plain_rate)
    unit = full.units if full is not None else math.nan
    parents = {null.spec: parent for parent, null in planner.nulls.items()}
    timed_beside = [m for m, d in planner.decisions.methods.items() if "same_trajectory" in d]
    references = [
        r
        for r in planner.rows
        if r.method == "plain" and _plain_part(planner, r) == SAME_TRAJECTORY_REFERENCE
    ]
    plain = dict.fromkeys(("race", "schedule_check", "other_seeds", "range_test"), 0.0)
    methods: dict[str, float] = {}
    unused = 0.0
    for row in planner.rows:
        timed = timed_cost(planner, row, references)
        units = rules.in_plain_runs(own_units(planner, row) if timed is None else timed, unit)
        part = _plain_part(planner, row) if row.method == "plain" else None
        owners = [parents.get(row.method, row.method)]
        if part == SAME_TRAJECTORY_REFERENCE:
            owners = timed_beside or ["same-trajectory methods"]  # a record whose check is still running
        if row.key not in planner.used:
            unused += units
        elif part in plain:
            plain[part] += units
        else:
            for owner in owners:
                methods[owner] = methods.get(owner, 0.0) + units / len(owners)
    plain["total"] = sum(plain.values())
    return {"plain": plain, "methods": methods, "unused": unused}


def timed_cost(planner: Planner, row: RunRow, references: Sequence[RunRow]) -> float | None:
    """The units of a judged-in-time method's short run, from its time: plain's reference run's units x
    the method's seconds over the references' mean. Its calibrated price (8 timed steps) can be far off
    such a method's run: on `instruct_docstrings` `torch.compile`'s steps were priced at 7.7x plain's
    (recompiling for new lengths), its run took 1.41x plain's time. None for every other row."""
    check = planner.decisions.methods.get(row.method, {}).get("same_trajectory")
    timed = [r for r in references if r.seconds > 0 and r.budget == row.budget]
    if not check or not check.get("matches") or row.kind != SEPARATE or not timed or row.seconds <= 0:
        return None
    if row.budget != check.get("budget") or row.seed != planner.first or row.failed:
        return None
    return timed[0].units * row.seconds / statistics.fmean(r.seconds for r in timed)


def _plain_part(planner: Planner, row: RunRow) -> str:
    if row.kind == RANGE_TEST:
        return "range_test"
    if row.seed != planner.first:
        return "other_seeds"
    separate = planner.decisions.mode == "separate"
    own_schedule = RunSpec.from_dict(row.spec).schedule.get("lr_scheduler_type") != WSD
    if own_schedule and not separate:  # first: a check at the reference's budget is a separate run too
        return "schedule_check"
    if row.kind == SEPARATE and row.budget == SAME_TRAJECTORY_BUDGET and not separate:
        return SAME_TRAJECTORY_REFERENCE
    return "race"
