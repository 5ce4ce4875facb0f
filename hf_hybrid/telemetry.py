"""What users see of the hybrid run besides the `hybrid/*` log keys: progress-bar postfix, timeline plot.

Plain functions over plain data, knowing nothing of `Trainer`. matplotlib is imported lazily and drawn
on an Agg canvas (no pyplot: the user's backend is left alone, and a headless node plots too).
"""

from __future__ import annotations

import logging
import math
import os
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .engine.engine import engine_stats
from .engine.timing import PartTimer

logger = logging.getLogger(__name__)

TIMELINE_PLOT_FILE = "hybrid_timeline.png"
WANDB_IMAGE_KEY = "train/hybrid/timeline"
PHASE_COLORS = {"warmup": "#d9d9d9", "full": "#c6dbef", "predict": "#fdd0a2", "correct": "#c7e9c0"}


def progress_postfix(phase: str | None, stats: Mapping[str, Any]) -> dict[str, str]:
    """The tqdm postfix: current phase and the share of backward passes skipped so far."""
    return {"phase": phase or "-", "skipped": f"{stats['backward_skipped_fraction']:.0%}"}


def console_line(phase: str | None, stats: Mapping[str, Any]) -> str:
    """What the console shows of the hybrid metrics at a logging step (trackers get every `hybrid/*` key)."""
    return f"{phase or '-'}, {stats['backward_skipped_fraction']:.0%} backward skipped"


def _bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def run_summary(stats: Mapping[str, Any]) -> str:
    """One paragraph at the end of training: what the phase machine did, what it cost, and why no phase
    opened, if none did."""
    steps = stats["steps_per_phase"]
    parts = [
        f"{stats['steps']} steps ({', '.join(f'{n} {phase}' for phase, n in steps.items() if n)})",
        f"{stats['backward_skipped']} backward passes skipped ({stats['backward_skipped_fraction']:.1%})",
        f"{stats['rollbacks']} rollback{'s' if stats['rollbacks'] != 1 else ''}",
    ]
    if stats.get("spike_guard"):
        restores, taken_back = stats["restores"], stats.get("taken_back_steps", [])
        scaled = stats.get("scaled_back_steps", [])
        batches = [step for step in stats["skip_steps"] if step not in taken_back]
        parts.append(
            f"spike guard: {restores} restore{'s' if restores != 1 else ''}"
            + (f" at step {', '.join(map(str, stats['restore_steps']))}" if restores else "")
            + f", {len(batches)} bad batch{'es' if len(batches) != 1 else ''} skipped"
            + (f" at step {', '.join(map(str, batches))}" if batches else "")
            + (f" ({stats['replays']} trained on a clean batch instead)" if stats.get("replays") else "")
            + f", {len(taken_back)} outsized update{'s' if len(taken_back) != 1 else ''} taken back"
            + (f" at step {', '.join(map(str, taken_back))}" if taken_back else "")
            + (f", {len(scaled)} of them kept at the last kept rate" if scaled else "")
            + f" ({stats['spike_skipped_steps']} batches skipped in all; copies in "
            + f"{stats['spike_guard_storage']}, {_bytes(stats['spike_guard_bytes'])})"
        )
    timing = stats.get("timing") or {}
    cost = f"engine: {_bytes(stats['engine_bytes'])} now, {_bytes(stats['engine_peak_bytes'])} at most"
    if timing.get("engine_time_share") is not None:
        cost += f", {timing['engine_time_share']:.1%} of the step time"
    text = "hf_hybrid: " + "; ".join(parts) + f"; {cost}."
    reason = no_predict_reason(stats)
    return text if reason is None else f"{text} {reason}"


def disabled_stats(config: Any) -> dict[str, Any]:
    """`hybrid_stats()` of a run without the engine: the same keys, zeros (a reader never hits a KeyError)."""
    return {
        "enabled": False,
        **engine_stats(config),
        "timing": PartTimer().summary(),
        "no_predict_reason": "The hybrid engine did not run (hybrid_enabled=False, or a set-up it does not "
        "support, which the start of training warned about).",
    }


def no_predict_reason(stats: Mapping[str, Any]) -> str | None:
    """Why no predict phase opened, and what to try (None when one did)."""
    steps = stats["steps_per_phase"]
    threshold = stats["confidence_threshold"]
    if stats["predict_phases"] > 0:
        return None
    warmup = steps.get("warmup", 0)
    if warmup == stats["steps"]:
        return (
            f"No predict phase opened: the run ended inside the warmup (`hybrid_warmup_steps`; all "
            f"{warmup} steps); lower it or train longer to give predict phases a chance."
        )
    if 2 * warmup >= stats["steps"]:
        return (
            f"No predict phase opened: {warmup} of the run's {stats['steps']} steps were warmup "
            f"(`hybrid_warmup_steps`), which left {stats['steps'] - warmup}; the highest measured "
            f"confidence after it was {stats['max_confidence']:.2f} (threshold {threshold:.2f}). Lower "
            "`hybrid_warmup_steps` or train longer to give predict phases a chance."
        )
    if stats["max_confidence"] >= threshold:
        return (
            "No predict phase opened: the run ended before the schedule allowed one (after the warmup a "
            "phase needs `hybrid_full_steps` FULL steps and `hybrid_min_history` observed updates)."
        )
    return (
        f"No predict phase opened: the highest measured confidence was {stats['max_confidence']:.2f}, "
        f"under the threshold {threshold:.2f} (`hybrid_confidence_threshold`), so this run trained "
        "like the plain Trainer. To see predict phases, lower the threshold or try another "
        "`hybrid_predictor`; measured on this project's benchmark, predicted steps have not beaten a "
        "tuned learning rate (README, 'Status')."
    )


def phase_segments(timeline: Sequence[Mapping[str, Any]]) -> list[tuple[str, int, int]]:
    """Runs of consecutive steps in one phase, as (phase, first step, last step)."""
    segments: list[tuple[str, int, int]] = []
    for row in timeline:
        phase, step = row["phase"], int(row["step"])
        if segments and segments[-1][0] == phase and segments[-1][2] == step - 1:
            segments[-1] = (phase, segments[-1][1], step)
        else:
            segments.append((phase, step, step))
    return segments


def measured_step_seconds(timeline: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Mean measured wall-clock seconds of one optimizer step, per phase (phases with timings only)."""
    sums: dict[str, list[float]] = {}
    for row in timeline:
        seconds = row.get("seconds")
        if seconds is not None and math.isfinite(seconds):
            sums.setdefault(row["phase"], []).append(float(seconds))
    return {phase: sum(values) / len(values) for phase, values in sums.items()}


def measured_time_saved_fraction(timeline: Sequence[Mapping[str, Any]]) -> float | None:
    """1 - (measured time of all steps) / (as many steps at the median real-step time); None untimed."""
    timed = [row for row in timeline if row.get("seconds") is not None and math.isfinite(row["seconds"])]
    real = [float(row["seconds"]) for row in timed if row["phase"] != "predict"]
    if not real:
        return None
    median = statistics.median(real)
    if median <= 0:
        return None
    return 1.0 - sum(float(row["seconds"]) for row in timed) / (len(timed) * median)


def plot_timeline(timeline: Sequence[Mapping[str, Any]], path: str | os.PathLike) -> Path:
    """Loss per step on a background shaded by phase, the loss model's forecast, and every rollback,
    spike-guard restore and skipped batch marked."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    if not timeline:
        raise ValueError("`timeline` is empty: there is nothing to plot (did training run any step?)")
    figure = Figure(figsize=(10, 4), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot(1, 1, 1)
    for phase, first, last in phase_segments(timeline):
        axes.axvspan(first - 0.5, last + 0.5, color=PHASE_COLORS.get(phase, "#ffffff"), linewidth=0)
    steps = [int(row["step"]) for row in timeline]
    axes.plot(steps, [_nan_if_none(row.get("loss")) for row in timeline], color="black", lw=1, label="loss")
    axes.plot(
        steps,
        [_nan_if_none(row.get("predicted_loss")) for row in timeline],
        color="tab:blue",
        lw=1,
        ls="--",
        label="predicted loss",
    )
    for action, color, marker in (
        ("rollback", "tab:red", "x"),
        ("restore", "tab:purple", "v"),
        ("skip", "tab:orange", "o"),
    ):
        rows = [
            row
            for row in timeline
            if row.get("action") == action or (action == "rollback" and row.get("rolled_back"))
        ]
        if rows:
            axes.scatter(
                [int(row["step"]) for row in rows],
                [_nan_if_none(row.get("loss")) for row in rows],
                color=color,
                marker=marker,
                zorder=3,
                label=f"{action} ({len(rows)})",
            )
    handles, _ = axes.get_legend_handles_labels()
    seen = dict.fromkeys(row["phase"] for row in timeline)
    handles += [Patch(color=PHASE_COLORS.get(p, "#ffffff"), label=p) for p in seen]
    axes.legend(handles=handles, loc="upper right", fontsize="small", ncol=2)
    axes.set_xlabel("optimizer step")
    axes.set_ylabel("training loss")
    axes.set_title("hf_hybrid phase timeline")
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png")
    return path


def log_image_to_wandb(wandb_module: Any, path: str | os.PathLike, global_step: int) -> None:
    """Log the plot on the run `WandbCallback` drives, stamped with `train/global_step` (its step metric
    for every key), so it lines up with the last training log instead of advancing wandb's own step."""
    wandb_module.log(
        {
            WANDB_IMAGE_KEY: wandb_module.Image(str(path), caption="phase timeline"),
            "train/global_step": global_step,
        }
    )


def _nan_if_none(value: float | None) -> float:
    return float("nan") if value is None else float(value)
