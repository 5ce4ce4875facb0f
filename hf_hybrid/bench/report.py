"""Benchmark outputs: results.json (every run), report.md (the table), one plot per task."""

from __future__ import annotations

import json
import platform
import statistics
from pathlib import Path
from typing import Any

import torch

from .suite import MAX_CLOCK_NOISE, MIN_SEEDS_FOR_SPREAD, MIN_TIMED_SECONDS, TaskReport, time_verdict

PHASE_COLORS = {"warmup": "#dddddd", "full": "#ffffff", "predict": "#ffd59e", "correct": "#b9e3b9"}


def write_report(reports: list[TaskReport], out: str | Path, meta: dict[str, Any]) -> dict[str, Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {**meta, "machine": _machine()}
    results = {
        "meta": meta,
        "overall": overall(reports),
        "tasks": [
            {
                "task": r.task,
                "best_lr_multiplier": r.best_lr_multiplier,
                "summary": r.summary,
                "per_seed": r.per_seed,
                "runs": [run.to_dict() for run in r.runs],
            }
            for r in reports
        ],
    }
    paths = {"json": out / "results.json", "markdown": out / "report.md"}
    paths["json"].write_text(json.dumps(results, indent=1, default=str))
    paths["markdown"].write_text(markdown(reports, meta))
    for r in reports:
        paths[f"plot_{r.task}"] = plot_task(r, out / f"{r.task}.png")
    return paths


def overall(reports: list[TaskReport]) -> dict[str, Any]:
    """Median over tasks of each task's median: the headline numbers, with the verdict on their time
    (judged by the shortest run and the largest clock noise of any task)."""
    if not reports:
        return {}
    keys = ("hybrid_speedup_time_median", "hybrid_speedup_units_median", "null_speedup_time_median",
            "null_speedup_units_median", "hybrid_backward_skipped_fraction_median")  # fmt: skip
    out: dict[str, Any] = {key: statistics.median(r.summary[key] for r in reports) for key in keys}
    noises = [r.summary["clock_noise"] for r in reports if r.summary["clock_noise"] is not None]
    out["clock_noise"] = max(noises, default=None)
    for name in ("hybrid", "null"):
        shortest = min(r.summary[f"{name}_shortest_seconds"] for r in reports)
        out[f"{name}_speedup_time_verdict"] = time_verdict(
            out[f"{name}_speedup_time_median"], shortest, out["clock_noise"]
        )
    return out


def markdown(reports: list[TaskReport], meta: dict[str, Any]) -> str:
    lines = [
        f"# hf-hybrid bench — suite `{meta.get('suite')}`",
        "",
        f"Command: `{meta.get('command')}`  ",
        f"Machine: {meta['machine']}  ",
        "Speed-up = plain Trainer's cost to reach the run's final eval loss (interpolated on its frontier of "
        "complete runs at 1/4, 1/2, 3/4 and all of N steps, at its best learning rate from the sweep) / the "
        "run's cost. Time excludes evaluation; it is the process's CPU time on CPU (robust to other load on "
        "the machine), wall-clock on CUDA. Units count forward = 1, backward = 2. `>` marks a lower "
        "bound (better than every frontier point), `<` an upper bound (worse than the cheapest). Extra "
        "memory: the engine's largest state after any step (a predict phase's rollback snapshot included) "
        "over the trainable parameters' bytes.",
        "",
        f"Time is a result only where it can be measured: a run that trained for less than "
        f"{MIN_TIMED_SECONDS:g} s is too short to time; the clock noise is measured on runs that did "
        "identical work (the learning-rate sweep at N steps, the plain runs of different seeds, the null "
        "control where it skipped nothing), and above "
        f"±{MAX_CLOCK_NOISE:.0%} no time ratio is given; a ratio within that noise of 1 reads "
        '"within noise". Seed ranges (min–max) and spreads need '
        f"{MIN_SEEDS_FOR_SPREAD} seeds or more.",
        "",
        "| task | best lr | seeds | run | eval loss − plain (median) | speed-up time (median, min–max) "
        "| speed-up units (median) | backward skipped | time / plain | extra memory / trainable |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in reports:
        s = r.summary
        for name in ("hybrid", "null"):
            kind = _bound_mark(r.per_seed, name)
            speedup = _time_text(s, name, "speedup_time", f"{kind}{{:.2f}}x", with_range=True)
            lines.append(
                f"| {r.task} | x{r.best_lr_multiplier:g} | {s['seeds']} | {name} "
                f"| {s[f'{name}_eval_loss_minus_plain_median']:+.4f} "
                f"| {speedup} "
                f"| {kind}{s[f'{name}_speedup_units_median']:.2f}x "
                f"| {s[f'{name}_backward_skipped_fraction_median']:.1%} "
                f"| {_time_text(s, name, 'time_ratio_vs_plain', '{:.2f}')} "
                f"| {s[f'{name}_extra_memory_ratio_median']:.2f} |"
            )
    lines += _device_memory_lines(reports)
    lines += ["", "Clock noise measured on runs that did identical work (largest deviation, by source):"]
    lines += [f"- {r.task}: {_noise_text(r.summary)}" for r in reports]
    lines += ["", "Plain Trainer seed-to-seed spread of final eval loss (max − min):"]
    lines += [f"- {r.task}: {_spread_text(r.summary)}" for r in reports]
    total = overall(reports)
    if total:
        hybrid, null = (
            _verdict_or(total[f"{name}_speedup_time_verdict"], total["clock_noise"])
            or f"{total[f'{name}_speedup_time_median']:.2f}x"
            for name in ("hybrid", "null")
        )
        lines += [
            "",
            f"**Median over tasks**: hybrid speed-up in time {hybrid}, in compute units "
            f"{total['hybrid_speedup_units_median']:.2f}x; null control in time {null}, in compute units "
            f"{total['null_speedup_units_median']:.2f}x.",
        ]
    return "\n".join(lines) + "\n"


def _time_text(summary: dict[str, Any], name: str, key: str, template: str, with_range: bool = False) -> str:
    """The median (with the seeds' min–max when there are enough seeds), or why time is no result."""
    reason = _verdict_or(summary[f"{name}_{key}_verdict"], summary["clock_noise"])
    if reason:
        return reason
    text = template.format(summary[f"{name}_{key}_median"])
    if with_range and summary["seeds"] >= MIN_SEEDS_FOR_SPREAD:
        text += f" ({summary[f'{name}_{key}_min']:.2f}–{summary[f'{name}_{key}_max']:.2f})"
    return text


def _verdict_or(verdict: str, noise: float | None) -> str:
    """ "" for a measured time, else what stands in its place."""
    if verdict == "measured":
        return ""
    if verdict == "too_short":
        return f"too short to time (< {MIN_TIMED_SECONDS:g} s)"
    if verdict == "too_noisy":
        return f"too noisy to time (±{noise:.0%})"
    return f"within noise (±{noise:.0%})"


def _noise_text(summary: dict[str, Any]) -> str:
    sources = summary["clock_noise_sources"]
    if not sources:
        return "not measured (one run of each kind, and the null control skipped batches)"
    parts = ", ".join(f"{name.replace('_', ' ')} {value:.1%}" for name, value in sources.items())
    return f"±{summary['clock_noise']:.1%} ({parts})"


def _spread_text(summary: dict[str, Any]) -> str:
    spread = summary["plain_eval_loss_spread"]
    if spread is None:
        return f"n/a ({summary['seeds']} seed; a spread needs {MIN_SEEDS_FOR_SPREAD} or more)"
    return f"{spread:.4f}"


def _device_memory_lines(reports: list[TaskReport]) -> list[str]:
    """Peak accelerator memory of the plain and hybrid runs at N (CUDA only; CPU runs have none)."""
    lines = []
    for r in reports:
        rows = [row for row in r.per_seed if row["hybrid"].get("device_peak_bytes") is not None]
        if rows:
            plain = max(row["hybrid"]["plain_device_peak_bytes"] for row in rows) / 2**20
            hybrid = max(row["hybrid"]["device_peak_bytes"] for row in rows) / 2**20
            lines.append(f"- {r.task}: peak device memory plain {plain:.0f} MiB, hybrid {hybrid:.0f} MiB")
    if not lines:
        return []
    return ["", "Peak device memory (torch.cuda.max_memory_allocated, largest over seeds):", *lines]


def _bound_mark(per_seed: list[dict[str, Any]], name: str) -> str:
    kinds = {row[name]["speedup_time_kind"] for row in per_seed}
    return ">" if kinds == {"lower_bound"} else "<" if kinds == {"upper_bound"} else ""


def plot_task(report: TaskReport, path: Path) -> Path:
    """Eval loss against training seconds for every run; the hybrid run's phases shaded per step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5))
    for run in report.runs:
        xs = [0.0] + [p["seconds"] for p in run.curve]
        ys = [float("nan")] + [p["eval_loss"] for p in run.curve]
        spec = run.spec
        if spec.kind == "plain":
            tuned = spec.lr_multiplier == report.best_lr_multiplier
            label = f"plain lr x{spec.lr_multiplier:g} budget {spec.budget:g} seed {spec.seed}"
            left.plot(xs, ys, "-o" if tuned else ":", color="C0" if tuned else "0.7", ms=3, lw=1, label=label)
        else:
            left.plot(xs, ys, "-s", color="C3" if spec.kind == "hybrid" else "C2", ms=4, lw=1.5,
                      label=f"{spec.kind} seed {spec.seed}")  # fmt: skip
    left.set_xlabel("training seconds (evaluation excluded)")
    left.set_ylabel("eval loss")
    left.set_title(f"{report.task}: eval loss vs training time")
    left.legend(fontsize=6)
    hybrid = next((r for r in report.runs if r.spec.kind == "hybrid"), None)
    if hybrid is not None:
        for step, phase in enumerate(hybrid.phases, start=1):
            right.axvspan(step - 0.5, step + 0.5, color=PHASE_COLORS.get(phase, "white"), lw=0)
        steps = [i for i, loss in enumerate(hybrid.losses, start=1) if loss is not None]
        right.plot(steps, [hybrid.losses[i - 1] for i in steps], color="C3", lw=0.8)
        right.set_xlabel("optimizer step (shading: grey warmup, orange predict, green correct)")
        right.set_ylabel("training loss (measured steps)")
        right.set_title(f"hybrid run, seed {hybrid.spec.seed}: phases")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _machine() -> str:
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"
    cpu = platform.processor() or platform.machine()
    return f"{cpu}, {device}, torch {torch.__version__}, {torch.get_num_threads()} torch threads"
