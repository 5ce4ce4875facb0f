"""`hf-hybrid bench --overhead [--awake]`: what the hybrid machinery costs, asleep and awake.

Per task, `pairs` plain/hybrid pairs of the same run, the order alternating so a drift of the machine's
speed falls on both sides (the clock: `runner.TrainingClock`); then one more hybrid run for the engine's
retained memory after every step (`memory.engine_retained_bytes`). `llama_3l` adds a model no preset is.

Awake: the hybrid runs predict (the null predictor, threshold 0: `awake_overrides`), so their time is no
measure of the bookkeeping; reported instead is the share of the step time that the hybrid machinery
measured for itself (`hybrid_stats()["timing"]`), in all and per part, against `AWAKE_SHARE_TARGETS`.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM, TrainerCallback

from ...data import BYTE_VOCAB_SIZE
from ..methods import parse_method
from ..runner import RunResult, run_trial
from ..task import BenchTask
from ..tasks import clm_data, get_task
from .memory import engine_retained_bytes

TIME_TARGET = 1.01  # median hybrid/plain
MEMORY_TARGET = 0.02  # of the trainable bytes, while asleep
# Awake: the hybrid machinery's share of the step time (issue 23); the 2x64 GPT-2's steps are so short
# that the fixed per-step bookkeeping weighs more.
AWAKE_SHARE_TARGETS = {"clm_stdlib": 0.10}
AWAKE_SHARE_TARGET = 0.05


# A model that is none of the presets, so the asleep overhead is not only measured where it was tuned.
LLAMA = "llama_3l"


def llama_task(size: str) -> BenchTask:
    """A 3x128 Llama from a config on `clm_stdlib`'s data and budget (RMSNorm, rotary, gated MLP)."""
    shape = get_task("clm_stdlib").size(size)
    train, evaluation, _ = clm_data(shape)
    config = LlamaConfig(
        vocab_size=BYTE_VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=352,
        num_hidden_layers=3,
        num_attention_heads=4,
        max_position_embeddings=shape.seq_len,
        bos_token_id=0,
        eos_token_id=0,
    )

    def build(seed: int) -> torch.nn.Module:
        torch.manual_seed(seed)
        return LlamaForCausalLM(config)

    return BenchTask(
        name=LLAMA,
        task_type="causal_lm",
        build_model=build,
        train=train,
        evaluation=evaluation,
        learning_rate=1e-3,
        max_steps=shape.steps,
        batch_size=shape.batch_size,
        eval_batch_size=64,
        info={"size": size, "description": "Llama 3x128 from a config, causal LM on stdlib source"},
    )


def _run(
    task: str, size: str, kind: str, seed: int, overrides: Sequence[tuple[str, Any]], callbacks: Any = ()
) -> RunResult:
    """One plain or hybrid run of a preset (or the Llama task) at its own rate and budget, one eval."""
    bench = llama_task(size) if task == LLAMA else get_task(task).bench_task(size)
    options = ",".join(f"{k}={json.dumps(v) if isinstance(v, dict | list) else v}" for k, v in overrides)
    method = parse_method(kind + (f":{options}" if options and kind != "plain" else ""))
    steps, rate = bench.max_steps, bench.learning_rate
    return run_trial(
        bench, method, learning_rate=rate, seed=seed, steps=steps, eval_points=1, callbacks=callbacks
    )


def awake_overrides(task: str, size: str) -> dict[str, Any]:
    """The null predictor at threshold 0 after a warmup of a tenth of the steps."""
    steps = get_task("clm_stdlib" if task == LLAMA else task).size(size).steps
    return {
        "hybrid_predictor": "null",
        "hybrid_confidence_threshold": 0.0,
        "hybrid_warmup_steps": max(1, steps // 10),
    }


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
        held = engine_retained_bytes(engine)
        row = {"step": state.global_step, "awake": engine.awake, "total": held.total}
        self.rows.append({**row, "tensors": held.tensors, "python": held.python})


def measure_task(
    task: str,
    size: str,
    pairs: int,
    seed: int = 0,
    hybrid_overrides: tuple[tuple[str, Any], ...] = (),
    progress: Callable[[str], None] = print,
    awake: bool = False,
) -> TaskOverhead:
    """`pairs` alternating plain/hybrid pairs; asleep, one more hybrid run for its retained memory."""
    if awake:
        hybrid_overrides = tuple(sorted({**awake_overrides(task, size), **dict(hybrid_overrides)}.items()))
    report = TaskOverhead(task, size)
    for index in range(pairs):
        order = ("plain", "hybrid") if index % 2 == 0 else ("hybrid", "plain")
        results: dict[str, RunResult] = {}
        for kind in order:
            results[kind] = _run(task, size, kind, seed, hybrid_overrides)
            progress(f"{task} pair {index + 1}/{pairs} {kind:6s} {results[kind].train_seconds:8.2f} s")
        report.pairs.append(_pair(results["plain"], results["hybrid"], order))
    if awake:
        report.summary = _awake_summary(task, report.pairs, dict(hybrid_overrides))
        return report
    probe = _MemoryProbe()
    probed = _run(task, size, "hybrid", seed, hybrid_overrides, callbacks=[probe])
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


def _pair(plain: RunResult, hybrid: RunResult, order: Sequence[str]) -> dict[str, Any]:
    timing = hybrid.stats.get("timing") or {}
    return {
        "order": list(order),
        "plain_seconds": plain.train_seconds,
        "hybrid_seconds": hybrid.train_seconds,
        "ratio": hybrid.train_seconds / plain.train_seconds,
        "clock": plain.clock,
        "plain_eval_loss": plain.eval_loss,
        "hybrid_eval_loss": hybrid.eval_loss,
        "steps_per_phase": hybrid.stats.get("steps_per_phase", {}),
        "predicted_steps": hybrid.stats.get("steps_per_phase", {}).get("predict", 0),
        "compute_saved_fraction": hybrid.stats.get("compute_saved_fraction"),
        "engine_time_share": timing.get("engine_time_share"),
        "part_shares": timing.get("parts", {}),
        "engine_seconds": timing.get("engine_seconds"),
        "step_seconds": timing.get("step_seconds"),
        "plain_device_peak_bytes": plain.device_peak_bytes,
        "hybrid_device_peak_bytes": hybrid.device_peak_bytes,
        "trainable_bytes": hybrid.trainable_bytes,
    }


def _awake_summary(task: str, pairs: Sequence[dict[str, Any]], overrides: dict[str, Any]) -> dict[str, Any]:
    """Median over the pairs of the hybrid machinery's share of the step time, in all and per part."""
    shares = [p["engine_time_share"] for p in pairs]
    parts = sorted({name for p in pairs for name in p["part_shares"]})
    target = AWAKE_SHARE_TARGETS.get(task, AWAKE_SHARE_TARGET)
    share = statistics.median(shares)
    return {
        "awake": True,
        "hybrid_overrides": overrides,
        "shares": shares,
        "median_share": share,
        "share_target": target,
        "share_target_met": share <= target,
        "part_shares": {n: statistics.median(p["part_shares"].get(n, 0.0) for p in pairs) for n in parts},
        "predicted_fraction": statistics.median(
            p["predicted_steps"] / max(sum(p["steps_per_phase"].values()), 1) for p in pairs
        ),
        "compute_saved_fraction": statistics.median(p["compute_saved_fraction"] for p in pairs),
        "ratios": [p["ratio"] for p in pairs],
        "median_ratio": statistics.median(p["ratio"] for p in pairs),
    }


def _met(ok: bool) -> str:
    return "met" if ok else "not met"


def format_table(reports: Sequence[TaskOverhead]) -> str:
    """One row per task: the ratios, the plain runs' spread, the machinery's own share, the memory."""
    lines = [
        f"| task | hybrid/plain time per pair | median (target <= {TIME_TARGET}) | plain runs' spread | "
        "hybrid machinery's own share of the step time | same eval loss | "
        f"engine memory asleep / trainable (target <= {MEMORY_TARGET:.0%}): total (tensors + Python) |",
        "|---|---|---|---|---|---|---|",
    ]
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
        memory = "never asleep"
        if (fraction := s["asleep_memory_fraction"]) is not None:
            memory = (
                f"{fraction:.2%} ({_met(s['memory_target_met'])}): {m['peak_asleep_bytes']} of "
                f"{m['trainable_bytes']} bytes ({tensors} + {last.get('python', 0)})"
            )
        lines.append(
            f"| `{r.task}` ({r.size}) | {ratios} | {s['median_ratio']:.3f} ({_met(s['time_target_met'])}) "
            f"| {spread:.1%} | {share} | {same} | {memory} |"
        )
    return "\n".join(lines)


def format_awake_table(reports: Sequence[TaskOverhead]) -> str:
    """Per task: what the awake run predicted and saved and its share; then each part's median share."""
    lines = [
        "| task | steps predicted | compute saved (units) | hybrid/plain time per pair | "
        "added share of the step time per pair | median (target) |",
        "|---|---|---|---|---|---|",
    ]
    for r in reports:
        s = r.summary
        lines.append(
            f"| `{r.task}` ({r.size}) | {s['predicted_fraction']:.0%} | {s['compute_saved_fraction']:.0%} | "
            + ", ".join(f"{x:.3f}" for x in s["ratios"])
            + " | "
            + ", ".join(f"{x:.2%}" for x in s["shares"])
            + f" | {s['median_share']:.2%} (<= {s['share_target']:.0%}: {_met(s['share_target_met'])}) |"
        )
    parts = sorted({n for r in reports for n in r.summary["part_shares"]})
    lines += [
        "",
        "| part | " + " | ".join(f"`{r.task}`" for r in reports) + " |",
        "|---|" + "---|" * len(reports),
    ]
    for name in parts:
        cells = " | ".join(f"{r.summary['part_shares'].get(name, 0.0):.2%}" for r in reports)
        lines.append(f"| {name} | {cells} |")
    return "\n".join(lines)


def run_overhead(
    tasks: Sequence[str],
    size: str,
    pairs: int,
    out: str | Path,
    hybrid_overrides: dict[str, Any] | None = None,
    echo: Callable[[str], None] = print,
    awake: bool = False,
) -> Path:
    if pairs < 1:
        raise ValueError(f"`pairs` must be >= 1, got {pairs}")
    overrides = tuple(sorted((hybrid_overrides or {}).items()))
    reports = [
        measure_task(task, size, pairs, hybrid_overrides=overrides, progress=echo, awake=awake)
        for task in tasks
    ]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    table = format_awake_table(reports) if awake else format_table(reports)
    (out / "overhead.json").write_text(json.dumps([asdict(r) for r in reports], indent=1))
    (out / "overhead.md").write_text(table + "\n")
    _plot(reports, out / "overhead.png", awake)
    echo(table)
    echo(f"results: {out}/overhead.json, overhead.md, overhead.png")
    return out / "overhead.json"


def _plot(reports: Sequence[TaskOverhead], path: Path, awake: bool) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 3.5), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot(1, 1, 1)
    (_plot_parts if awake else _plot_ratios)(axes, reports)
    axes.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    figure.tight_layout()
    figure.savefig(path, format="png")


def _plot_ratios(axes: Any, reports: Sequence[TaskOverhead]) -> None:
    for i, r in enumerate(reports):
        ratios = r.summary["ratios"]
        axes.scatter([i] * len(ratios), ratios, color="tab:blue", s=18)
        axes.hlines(r.summary["median_ratio"], i - 0.25, i + 0.25, color="black")
    axes.axhline(1.0, color="grey", lw=0.8)
    axes.axhline(TIME_TARGET, color="tab:red", lw=0.8, ls="--", label=f"target {TIME_TARGET}")
    axes.set_xticks(range(len(reports)), [r.task for r in reports])
    axes.set_ylabel("hybrid / plain time")
    axes.set_title("hf_hybrid engine overhead (default settings)")


def _plot_parts(axes: Any, reports: Sequence[TaskOverhead]) -> None:
    """One bar per task: the median share of each part, stacked; the task's target as a red tick."""
    parts = sorted({n for r in reports for n in r.summary["part_shares"]})
    bottoms = [0.0] * len(reports)
    for name in parts:
        heights = [100 * r.summary["part_shares"].get(name, 0.0) for r in reports]
        axes.bar(range(len(reports)), heights, bottom=bottoms, label=name, width=0.6)
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    for i, r in enumerate(reports):
        axes.hlines(100 * r.summary["share_target"], i - 0.4, i + 0.4, color="tab:red", ls="--")
    axes.set_xticks(range(len(reports)), [r.task for r in reports])
    axes.set_ylabel("% of the step time")
    axes.set_title("hf_hybrid awake: the hybrid machinery's share, by part")
