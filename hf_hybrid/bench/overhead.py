"""`hf-hybrid bench --overhead`: what the hybrid engine costs when it does not predict.

Per task, in one process: `pairs` plain/hybrid pairs of the same run (same model, data, seed, arguments,
default hybrid settings), the order inside a pair alternating (plain first, then hybrid first, ...) so a
drift of the machine's speed falls on both sides. The clock is the process's CPU time on CPU and
wall-clock on CUDA (see `runner._Clock`). Reported: each pair's hybrid/plain time, their median, and
whether the hybrid run trained exactly like the plain one (same eval loss).

Memory: one more hybrid run measures the engine's retained memory after every step by walking its live
objects (`memory.engine_retained_bytes`: tensor storage by device plus the Python objects, the model and
the optimizer excluded), reported at its largest while asleep and overall, against the trainable bytes.
On CUDA the device peak of the timed runs is reported too.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from .memory import engine_retained_bytes
from .runner import RunResult, RunSpec, run

TIME_TARGET = 1.01  # median hybrid/plain
MEMORY_TARGET = 0.02  # of the trainable bytes, while asleep


@dataclass
class TaskOverhead:
    task: str
    size: str
    pairs: list[dict[str, Any]] = field(default_factory=list)
    memory: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)


class _MemoryProbe(TrainerCallback):
    """After every optimizer step: the engine's retained memory, and whether it is asleep."""

    def __init__(self) -> None:
        self.trainer: Any = None
        self.rows: list[dict[str, Any]] = []

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        engine = getattr(self.trainer, "engine", None)
        if engine is None:
            return
        measured = engine_retained_bytes(engine)
        self.rows.append(
            {
                "step": state.global_step,
                "awake": engine.awake,
                "total": measured.total,
                "tensors": measured.tensors,
                "python": measured.python,
            }
        )


def measure_task(
    task: str,
    size: str,
    pairs: int,
    seed: int = 0,
    hybrid_overrides: tuple[tuple[str, Any], ...] = (),
    progress: Callable[[str], None] = print,
) -> TaskOverhead:
    report = TaskOverhead(task, size)
    for index in range(pairs):
        order = ("plain", "hybrid") if index % 2 == 0 else ("hybrid", "plain")
        results: dict[str, RunResult] = {}
        for kind in order:
            results[kind] = run(
                RunSpec(task, size, kind, seed, hybrid_overrides=hybrid_overrides, eval_points=1)
            )
            progress(f"{task} pair {index + 1}/{pairs} {kind:6s} {results[kind].train_seconds:8.2f} s")
        plain, hybrid = results["plain"], results["hybrid"]
        report.pairs.append(
            {
                "order": list(order),
                "plain_seconds": plain.train_seconds,
                "hybrid_seconds": hybrid.train_seconds,
                "ratio": hybrid.train_seconds / plain.train_seconds,
                "clock": plain.clock,
                "plain_eval_loss": plain.eval_loss,
                "hybrid_eval_loss": hybrid.eval_loss,
                "predicted_steps": hybrid.stats.get("steps_per_phase", {}).get("predict", 0),
                "engine_time_share": (hybrid.stats.get("timing") or {}).get("engine_time_share"),
                "plain_device_peak_bytes": plain.device_peak_bytes,
                "hybrid_device_peak_bytes": hybrid.device_peak_bytes,
                "trainable_bytes": hybrid.trainable_bytes,
            }
        )
    probe = _MemoryProbe()
    probed = run(
        RunSpec(task, size, "hybrid", seed, hybrid_overrides=hybrid_overrides, eval_points=1),
        callbacks=[probe],
    )
    trainable = probed.trainable_bytes
    asleep = [row["total"] for row in probe.rows if not row["awake"]]
    report.memory = {
        "trainable_bytes": trainable,
        "peak_asleep_bytes": max(asleep, default=None),
        "peak_bytes": max((row["total"] for row in probe.rows), default=None),
        "steps_asleep": len(asleep),
        "steps": len(probe.rows),
        "last": probe.rows[-1] if probe.rows else None,
    }
    ratios = [pair["ratio"] for pair in report.pairs]
    report.summary = {
        "median_ratio": statistics.median(ratios),
        "ratios": ratios,
        "same_eval_loss": all(p["plain_eval_loss"] == p["hybrid_eval_loss"] for p in report.pairs),
        "asleep_memory_fraction": None if not asleep else max(asleep) / trainable,
        "time_target_met": statistics.median(ratios) <= TIME_TARGET,
        "memory_target_met": bool(asleep) and max(asleep) / trainable <= MEMORY_TARGET,
    }
    return report


def format_table(reports: Sequence[TaskOverhead]) -> str:
    """One row per task. Next to the A/B ratio: the plain runs' own spread (what one ratio can resolve)
    and the engine's self-measured share of the step time (host time in its calls, on CPU exact)."""
    lines = [
        f"| task | hybrid/plain time per pair | median (target <= {TIME_TARGET}) | plain runs' spread | "
        "engine's own share of the step time | same eval loss | "
        f"engine memory asleep / trainable (target <= {MEMORY_TARGET:.0%}): total (tensors + Python) |",
        "|---|---|---|---|---|---|---|",
    ]

    def met(ok: bool) -> str:
        return "met" if ok else "not met"

    for r in reports:
        s, m = r.summary, r.memory
        ratios = ", ".join(f"{x:.3f}" for x in s["ratios"])
        plain = [p["plain_seconds"] for p in r.pairs]
        spread = (max(plain) - min(plain)) / min(plain)
        shares = [p["engine_time_share"] for p in r.pairs if p.get("engine_time_share") is not None]
        share = f"{statistics.median(shares):.2%}" if shares else "n/a"
        same = "yes" if s["same_eval_loss"] else "no"
        last = m.get("last") or {}
        tensors = sum((last.get("tensors") or {}).values())
        if s["asleep_memory_fraction"] is None:
            memory = "never asleep"
        else:
            fraction = s["asleep_memory_fraction"]
            memory = (
                f"{fraction:.2%} ({met(s['memory_target_met'])}): {m['peak_asleep_bytes']} of "
                f"{m['trainable_bytes']} bytes ({tensors} + {last.get('python', 0)})"
            )
        lines.append(
            f"| `{r.task}` ({r.size}) | {ratios} | {s['median_ratio']:.3f} ({met(s['time_target_met'])}) | "
            f"{spread:.1%} | {share} | {same} | {memory} |"
        )
    return "\n".join(lines)


def run_overhead(
    tasks: Sequence[str],
    size: str,
    pairs: int,
    out: str | Path,
    hybrid_overrides: dict[str, Any] | None = None,
    echo: Callable[[str], None] = print,
) -> Path:
    if pairs < 1:
        raise ValueError(f"`pairs` must be >= 1, got {pairs}")
    overrides = tuple(sorted((hybrid_overrides or {}).items()))
    reports = [measure_task(task, size, pairs, hybrid_overrides=overrides, progress=echo) for task in tasks]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    table = format_table(reports)
    (out / "overhead.json").write_text(json.dumps([asdict(r) for r in reports], indent=1))
    (out / "overhead.md").write_text(table + "\n")
    _plot(reports, out / "overhead.png")
    echo(table)
    echo(f"results: {out}/overhead.json, overhead.md, overhead.png")
    return out / "overhead.json"


def _plot(reports: Sequence[TaskOverhead], path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6, 3), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot(1, 1, 1)
    for i, r in enumerate(reports):
        ratios = r.summary["ratios"]
        axes.scatter([i] * len(ratios), ratios, color="tab:blue", s=18)
        axes.hlines(r.summary["median_ratio"], i - 0.25, i + 0.25, color="black")
    axes.axhline(1.0, color="grey", lw=0.8)
    axes.axhline(TIME_TARGET, color="tab:red", lw=0.8, ls="--", label=f"target {TIME_TARGET}")
    axes.set_xticks(range(len(reports)), [r.task for r in reports])
    axes.set_ylabel("hybrid / plain time")
    axes.set_title("hf_hybrid engine overhead (default settings)")
    axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, format="png")
