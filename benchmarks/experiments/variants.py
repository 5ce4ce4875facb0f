"""Try hybrid variants on one task against the plain frontier, in compute units and time.

    python benchmarks/experiments/variants.py --task clm_stdlib --size quick \
        --out benchmarks/experiments/results/x.json --variant name:hybrid_predictor=ema,hybrid_check_every=0

Every variant runs at the plain Trainer's best learning rate (swept first, x0.5..x4), next to a null
control that replays its phases. Results (JSON) feed benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

from hf_hybrid.bench.frontier import speedup
from hf_hybrid.bench.overrides import parse_hybrid_overrides as _parse_overrides
from hf_hybrid.bench.runner import RunSpec, run
from hf_hybrid.bench.suite import BUDGETS


def main() -> None:
    parser = experiment_parser("name:field=value,field=value")
    parser.add_argument("--no-null", action="store_true")
    parser.add_argument(
        "--frontier-from",
        help="a bench results.json: reuse its plain frontier for --seed instead of running one (compute-unit "
        "speed-ups only: times from another invocation are not comparable, so time speed-ups are dropped)",
    )
    opts = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))

    def log(result, label):
        skipped = result.stats.get("backward_skipped_fraction", 0)
        print(f"{label:40s} loss {result.eval_loss:.4f} units {result.compute_units:7.0f} "
              f"time {result.train_seconds:6.1f}s skipped {skipped:.0%} "
              f"rollbacks {result.stats.get('rollbacks', 0)}", flush=True)  # fmt: skip

    if opts.frontier_from:
        best, frontier, sweep = saved_frontier(opts.frontier_from, opts.task, opts.seed)
    else:
        best, frontier, sweep = plain_frontier(opts.task, opts.size, opts.seed, opts.multipliers, log)
    rows = []
    for item in opts.variant:
        name, _, fields = item.partition(":")
        overrides = tuple(sorted(_parse_overrides([f for f in fields.split(",") if f]).items()))
        spec = RunSpec(
            opts.task, opts.size, "hybrid", opts.seed, best.spec.lr_multiplier, hybrid_overrides=overrides
        )
        result = run(spec)
        log(result, name)
        row = {"variant": name, "overrides": dict(overrides), **_scores(frontier, result)}
        if not opts.no_null:
            null = run(RunSpec(**{**spec.__dict__, "kind": "null", "script": tuple(result.phases)}))
            log(null, f"  null control of {name}")
            row["null"] = _scores(frontier, null)
        rows.append(row)
    write_results(opts, best, frontier, sweep, rows)


def experiment_parser(variant_help: str) -> argparse.ArgumentParser:
    """Options every experiment script takes: task, size, seed, LR sweep, variants, output."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--task", default="clm_stdlib")
    parser.add_argument("--size", default="quick")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--multipliers", type=float, nargs="+", default=[0.5, 1.0, 2.0, 4.0])
    parser.add_argument("--variant", action="append", default=[], help=variant_help)
    parser.add_argument("--out", required=True)
    return parser


def plain_frontier(task, size, seed, multipliers, log):
    """The plain Trainer's LR sweep at the full budget, and its frontier at the best rate."""
    sweep = []
    for m in multipliers:
        sweep.append(run(RunSpec(task, size, "plain", seed, m)))
        log(sweep[-1], f"plain x{m:g}")
    best = min(sweep, key=lambda r: r.eval_loss)
    frontier = [best]
    for budget in BUDGETS[:-1]:
        frontier.append(run(RunSpec(task, size, "plain", seed, best.spec.lr_multiplier, budget)))
        log(frontier[-1], f"plain x{best.spec.lr_multiplier:g} budget {budget}")
    return best, frontier, sweep


def saved_frontier(path, task, seed):
    """The plain runs of a `hf-hybrid bench` results.json (or of an experiment's JSON, whose frontier is at
    its own seed), as (best, frontier, sweep) with no timings."""
    data = json.loads(Path(path).read_text())
    if "frontier" in data:
        if (data["task"], data["seed"]) != (task, seed):
            raise ValueError(f"{path} holds the frontier of {data['task']} seed {data['seed']}")

        def point(f, multiplier):
            spec = SimpleNamespace(lr_multiplier=multiplier, budget=f.get("budget", 1.0))
            units, loss = f.get("units", math.nan), f["eval_loss"]
            return SimpleNamespace(spec=spec, eval_loss=loss, compute_units=units, train_seconds=math.nan)

        best_multiplier = data["best_lr_multiplier"]
        frontier = sorted((point(f, best_multiplier) for f in data["frontier"]), key=lambda r: -r.spec.budget)
        return frontier[0], frontier, [point(f, f["multiplier"]) for f in data["sweep"]]
    tasks = data["tasks"]
    saved = next(t for t in tasks if t["task"] == task)
    plain = [r for r in saved["runs"] if r["spec"]["kind"] == "plain"]

    def result(r):
        return SimpleNamespace(
            spec=SimpleNamespace(**r["spec"]), eval_loss=r["eval_loss"], compute_units=r["compute_units"],
            train_seconds=math.nan,
        )  # fmt: skip

    multiplier = saved["best_lr_multiplier"]
    at_best = [r for r in plain if r["spec"]["seed"] == seed and r["spec"]["lr_multiplier"] == multiplier]
    frontier = sorted((result(r) for r in at_best), key=lambda r: -r.spec.budget)
    first_seed = plain[0]["spec"]["seed"]
    sweep = [result(r) for r in plain if r["spec"]["budget"] == 1.0 and r["spec"]["seed"] == first_seed]
    return frontier[0], frontier, sweep


def write_results(opts, best, frontier, sweep, rows):
    Path(opts.out).parent.mkdir(parents=True, exist_ok=True)
    Path(opts.out).write_text(json.dumps({
        "command": " ".join(sys.argv), "task": opts.task, "size": opts.size, "seed": opts.seed,
        "best_lr_multiplier": best.spec.lr_multiplier,
        "frontier": [{"budget": r.spec.budget, "eval_loss": r.eval_loss, "units": r.compute_units,
                      "seconds": r.train_seconds if math.isfinite(r.train_seconds) else None}
                     for r in frontier],
        "sweep": [{"multiplier": r.spec.lr_multiplier, "eval_loss": r.eval_loss} for r in sweep],
        "variants": rows,
    }, indent=1))  # fmt: skip


def _scores(frontier, result):
    units = speedup(
        [(r.compute_units, r.eval_loss) for r in frontier], result.eval_loss, result.compute_units
    )
    time = SimpleNamespace(ratio=None, kind="not_timed")  # a frontier read from another invocation
    if all(math.isfinite(r.train_seconds) for r in frontier):
        points = [(r.train_seconds, r.eval_loss) for r in frontier]
        time = speedup(points, result.eval_loss, result.train_seconds)
    return {
        "eval_loss": result.eval_loss,
        "units": result.compute_units,
        "seconds": result.train_seconds,
        "speedup_units": units.ratio,
        "speedup_units_kind": units.kind,
        "speedup_time": time.ratio,
        "speedup_time_kind": time.kind,
        "skipped": result.stats.get("backward_skipped_fraction", 0.0),
        "rollbacks": result.stats.get("rollbacks", 0),
    }


if __name__ == "__main__":
    main()
