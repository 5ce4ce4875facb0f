"""The side-by-side benchmark: plain Trainer (tuned LR, several budgets) vs HybridHFTrainer vs null control.

Per task: a learning-rate sweep of the plain Trainer at the full budget (on the first seed) picks its
best learning rate; at that rate, for every seed, the plain Trainer runs at each budget (its frontier),
the hybrid trainer runs at the full budget, and the null control (the null predictor replaying the
hybrid run's exact phases) runs too. All runs of one invocation share the process, one after the other.

Time is only reported where it can be measured (`time_verdict`): a run that trained for less than
`MIN_TIMED_SECONDS` is too short (start-up and the clock dominate), and a time ratio within the measured
clock noise of 1 is not a result. The noise is measured on runs that did identical work (`clock_noise`):
the sweep's runs at the full budget (the learning rate does not change the compute), the plain runs of
different seeds, and the null control where it skipped nothing. A spread needs `MIN_SEEDS_FOR_SPREAD`.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .frontier import speedup
from .runner import RunResult, RunSpec, run

logger = logging.getLogger(__name__)

BUDGETS = (0.25, 0.5, 0.75, 1.0)
MIN_TIMED_SECONDS = 5.0  # training time (CPU time on CPU) below which a run is too short to time
MAX_CLOCK_NOISE = 0.25  # measured relative clock noise above which the clock itself is not trusted
MIN_SEEDS_FOR_SPREAD = 2
VERDICTS = {
    "measured": "measured",
    "too_short": f"too short to time (a run trained < {MIN_TIMED_SECONDS:g} s)",
    "too_noisy": f"too noisy to time (clock noise > ±{MAX_CLOCK_NOISE:.0%})",
    "within_noise": "within clock noise of 1",
}
MAX_EXTENSIONS = 2  # times the LR sweep may be widened past its edge
SUITES: dict[str, dict[str, Any]] = {
    "tiny": {
        "size": "tiny",
        "tasks": ("clm_stdlib",),
        "seeds": (0,),
        "lr_multipliers": (1.0, 2.0),
        "widen": 0,
    },
    "quick": {
        "size": "quick",
        "tasks": ("clm_stdlib", "minilm_cls", "minilm_lora"),
        "seeds": (0,),
        "lr_multipliers": (0.5, 1.0, 2.0, 4.0),
        "widen": MAX_EXTENSIONS,
    },
    "full": {
        "size": "full",
        "tasks": ("clm_stdlib", "minilm_cls", "minilm_lora"),
        "seeds": (0, 1, 2),
        "lr_multipliers": (0.5, 1.0, 2.0, 4.0),
        "widen": MAX_EXTENSIONS,
    },
}


@dataclass
class TaskReport:
    task: str
    best_lr_multiplier: float
    runs: list[RunResult] = field(default_factory=list)
    per_seed: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)


def run_suite(
    suite: str,
    tasks: Sequence[str] | None = None,
    seeds: Sequence[int] | None = None,
    hybrid_overrides: dict[str, Any] | None = None,
    progress: Callable[[str], None] = logger.info,
) -> list[TaskReport]:
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; suites: {sorted(SUITES)}")
    config = SUITES[suite]
    overrides = tuple(sorted((hybrid_overrides or {}).items()))
    reports = []
    for task in tasks or config["tasks"]:
        reports.append(
            _run_task(
                task,
                config["size"],
                seeds or config["seeds"],
                config["lr_multipliers"],
                config["widen"],
                overrides,
                progress,
            )
        )
    return reports


def _run_task(
    task: str,
    size: str,
    seeds: Sequence[int],
    multipliers: Sequence[float],
    widen: int,
    overrides: tuple[tuple[str, Any], ...],
    progress: Callable[[str], None],
) -> TaskReport:
    def go(spec: RunSpec) -> RunResult:
        result = run(spec)
        progress(
            f"{task} seed {spec.seed} {spec.kind:6s} lr x{spec.lr_multiplier:<4g} budget {spec.budget:<4g} "
            f"eval loss {result.eval_loss:.4f} {result.train_seconds:6.1f}s {result.compute_units:7.0f} units"
        )
        return result

    run(RunSpec(task, size, "plain", seeds[0], budget=BUDGETS[0]))  # untimed warm-up: caches, allocator
    sweep = [go(RunSpec(task, size, "plain", seeds[0], m)) for m in multipliers]
    sweep = _widen_sweep(sweep, lambda m: go(RunSpec(task, size, "plain", seeds[0], m)), widen)
    best = min(sweep, key=lambda r: r.eval_loss).spec.lr_multiplier
    report = TaskReport(task, best, runs=list(sweep))
    for seed in seeds:
        frontier = [r for r in sweep if r.spec.lr_multiplier == best and r.spec.seed == seed]
        for budget in BUDGETS:
            if not any(r.spec.budget == budget for r in frontier):
                frontier.append(go(RunSpec(task, size, "plain", seed, best, budget)))
        hybrid = go(RunSpec(task, size, "hybrid", seed, best, hybrid_overrides=overrides))
        null = go(
            RunSpec(task, size, "null", seed, best, hybrid_overrides=overrides, script=tuple(hybrid.phases))
        )
        report.runs += [r for r in frontier if r not in report.runs] + [hybrid, null]
        report.per_seed.append(_compare(seed, frontier, hybrid, null))
    report.summary = _summarize(report.per_seed, clock_noise(sweep, report.per_seed))
    return report


def _widen_sweep(
    sweep: list[RunResult], try_multiplier: Callable[[float], RunResult], extensions: int
) -> list[RunResult]:
    """While the best learning rate is the sweep's largest (smallest), try twice (half) that rate: a best
    rate at the edge of the sweep means the plain Trainer was not tuned."""
    sweep = list(sweep)
    for _ in range(extensions):
        multipliers = sorted(r.spec.lr_multiplier for r in sweep)
        best = min(sweep, key=lambda r: r.eval_loss).spec.lr_multiplier
        if best == multipliers[-1]:
            sweep.append(try_multiplier(best * 2))
        elif best == multipliers[0]:
            sweep.append(try_multiplier(best / 2))
        else:
            break
    return sweep


def _compare(seed: int, frontier: list[RunResult], hybrid: RunResult, null: RunResult) -> dict[str, Any]:
    by_time = [(r.train_seconds, r.eval_loss) for r in frontier]
    by_units = [(r.compute_units, r.eval_loss) for r in frontier]
    full = next(r for r in frontier if r.spec.budget == 1.0)
    row: dict[str, Any] = {
        "seed": seed,
        "plain_eval_loss": full.eval_loss,
        "plain_seconds": full.train_seconds,
    }
    for name, result in (("hybrid", hybrid), ("null", null)):
        time_speedup = speedup(by_time, result.eval_loss, result.train_seconds)
        unit_speedup = speedup(by_units, result.eval_loss, result.compute_units)
        row[name] = {
            "eval_loss": result.eval_loss,
            "eval_loss_minus_plain": result.eval_loss - full.eval_loss,
            "seconds": result.train_seconds,
            "speedup_time": time_speedup.ratio,
            "speedup_time_kind": time_speedup.kind,
            "speedup_units": unit_speedup.ratio,
            "speedup_units_kind": unit_speedup.kind,
            "backward_skipped_fraction": result.stats.get("backward_skipped_fraction", 0.0),
            "rollbacks": result.stats.get("rollbacks", 0),
            "extra_memory_ratio": result.engine_peak_bytes / max(result.trainable_bytes, 1),
            "device_peak_bytes": result.device_peak_bytes,
            "plain_device_peak_bytes": full.device_peak_bytes,
            "time_ratio_vs_plain": result.train_seconds / full.train_seconds,
            "wall_ratio_vs_plain": result.wall_seconds / max(full.wall_seconds, 1e-9),
        }
    return row


def clock_noise(sweep: Sequence[RunResult], per_seed: list[dict[str, Any]]) -> dict[str, float]:
    """Relative time deviations between runs that did identical work, by source (absent: not measured).

    `lr_sweep`: max/min − 1 of the sweep's run times at the full budget (the learning rate changes no
    compute); `plain_seeds`: the same over the plain runs at N of each seed; `null_control`: the largest
    |null time / plain − 1| over seeds whose null control skipped no backward pass (its work was the
    plain run's, its engine's bookkeeping included).
    """
    out: dict[str, float] = {}
    sweep_times = [r.train_seconds for r in sweep if r.spec.budget == 1.0]
    plain_times = [row["plain_seconds"] for row in per_seed]
    for name, times in (("lr_sweep", sweep_times), ("plain_seeds", plain_times)):
        if len(times) >= 2 and min(times) > 0:
            out[name] = max(times) / min(times) - 1.0
    idle = [
        abs(row["null"]["time_ratio_vs_plain"] - 1.0)
        for row in per_seed
        if row["null"]["backward_skipped_fraction"] == 0
    ]
    if idle:
        out["null_control"] = max(idle)
    return out


def time_verdict(ratio: float, shortest_seconds: float, noise: float | None) -> str:
    """`measured`, or why `ratio` (a time speed-up or time ratio against plain) is not a result: a run
    shorter than MIN_TIMED_SECONDS, clock noise above MAX_CLOCK_NOISE, or |ratio − 1| within the noise."""
    if shortest_seconds < MIN_TIMED_SECONDS:
        return "too_short"
    if noise is not None and noise > MAX_CLOCK_NOISE:
        return "too_noisy"
    if noise is not None and abs(ratio - 1.0) <= noise:
        return "within_noise"
    return "measured"


def _summarize(per_seed: list[dict[str, Any]], noise: dict[str, float] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"seeds": len(per_seed)}
    plain_losses = [row["plain_eval_loss"] for row in per_seed]
    enough = len(per_seed) >= MIN_SEEDS_FOR_SPREAD
    out["plain_eval_loss_spread"] = max(plain_losses) - min(plain_losses) if enough else None
    for name in ("hybrid", "null"):
        for key in ("speedup_time", "speedup_units", "eval_loss_minus_plain", "backward_skipped_fraction",
                    "time_ratio_vs_plain", "wall_ratio_vs_plain", "extra_memory_ratio"):  # fmt: skip
            values = [row[name][key] for row in per_seed]
            out[f"{name}_{key}_median"] = statistics.median(values)
            out[f"{name}_{key}_min"] = min(values)
            out[f"{name}_{key}_max"] = max(values)
    noise = noise or {}
    out["clock_noise_sources"] = noise
    out["clock_noise"] = max(noise.values()) if noise else None
    for name in ("hybrid", "null"):
        shortest = min(min(row["plain_seconds"], row[name]["seconds"]) for row in per_seed)
        out[f"{name}_shortest_seconds"] = shortest
        for key in ("speedup_time", "time_ratio_vs_plain"):
            out[f"{name}_{key}_verdict"] = time_verdict(
                out[f"{name}_{key}_median"], shortest, out["clock_noise"]
            )
    return out
