"""`report.md` and `arena.png`, generated from the record (never edited by hand)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .verdicts import ONE_SEED_BAND, frontier

REPORT_FILE = "report.md"
PLOT_FILE = "arena.png"


def write_report(data: Mapping[str, Any], out: str | Path) -> dict[str, Path]:
    out = Path(out)
    paths = {"json": out / "results.json", "markdown": out / REPORT_FILE, "plot": out / PLOT_FILE}
    paths["markdown"].write_text(markdown(data))
    plot(data, paths["plot"])
    return paths


def verdict_table(data: Mapping[str, Any]) -> list[str]:
    lines = [
        "| method | lr (x plain best) | seeds | speed-up, compute units | speed-up, time "
        "| final eval loss − plain | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in data.get("verdicts", []):
        seeds = ", ".join(str(s) for s in row["seeds"])
        units = _speedup_text(row, "speedup_units")
        time = _speedup_text(row, "speedup_time")
        if row.get("speedup_time_within_clock_noise"):
            time += " (within clock noise)"
        factor = row.get("lr_multiplier_of_plain_best", 1.0)
        lines.append(
            f"| `{row['method']}` | x{factor:g} | {seeds} | {units} | {time} "
            f"| {row['final_loss_delta']:+.4f} "
            f"| **{row['verdict']}** |"
        )
    return lines


def _speedup_text(row: Mapping[str, Any], key: str) -> str:
    per_seed = row.get("per_seed") or []
    text = f"{row[key]:.2f}x"
    kinds = {r[f"{key}_kind"] for r in per_seed}
    if kinds == {"lower_bound"}:
        text = ">" + text
    elif kinds == {"upper_bound"}:
        text = "<" + text
    if len(per_seed) > 1:
        values = [r[key] for r in per_seed]
        text += f" ({min(values):.2f}–{max(values):.2f})"
    return text


def markdown(data: Mapping[str, Any]) -> str:
    task, plain, calibration = data["task"], data.get("plain") or {}, data.get("calibration") or {}
    units = ", ".join(f"{k} {v:.2f}" for k, v in (calibration.get("units") or {}).items())
    lines = [
        f"# hf-hybrid bench — {task.get('name')}",
        "",
        f"Command: `{data['command']}`  ",
        f"Machine: {data['machine']}  ",
        f"Task: {_task_text(task)}",
        "",
        "Speed-up = the plain Trainer's cost to reach the method's final eval loss (read off its frontier of "
        "complete runs at 1/4, 1/2, 3/4 and all of the budget, at its best learning rate from the sweep) / "
        "the method's cost; the median over seeds, with the range. Compute units are forward passes, each "
        "kind "
        f"of step priced by timing it on this task ({units}); time is the process's CPU time on CPU, "
        "wall-clock on CUDA, evaluation excluded. `>` marks a lower bound (better than every frontier "
        "point), "
        "`<` an upper bound (worse than the cheapest).",
        "",
        *verdict_table(data),
        "",
        _plain_text(plain),
        "",
        "Verdict: `wins` = every seed above 1.0x and above 1 + the plain seed band (how far one seed's plain "
        "run reads from 1.0x on another seed's frontier); `loses` = every seed below 1 − that band (with one "
        f"seed, below {1 - ONE_SEED_BAND:g}x); `ties` otherwise — one seed cannot show a win.",
    ]
    notes = sorted({(r["method"], r["note"]) for r in data["runs"] if r.get("note")})
    if notes:
        lines += ["", "Notes from the runs:"] + [f"- `{m}`: {n}" for m, n in notes]
    lines += [
        "",
        "Runs (final eval loss, units, seconds):",
        "",
        "| method | role | lr | seed | steps | eval loss | units | seconds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in data["runs"]:
        lines.append(
            f"| `{r['method']}` | {r['role']} | {r['learning_rate']:.3g} | {r['seed']} | {r['steps']} "
            f"| {r['eval_loss']:.4f} | {r['units']:.0f} | {r['seconds']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def _task_text(task: Mapping[str, Any]) -> str:
    keys = (
        "description",
        "model_name_or_path",
        "dataset",
        "task_type",
        "peft",
        "max_steps",
        "per_device_train_batch_size",
        "learning_rate",
        "train_examples",
        "eval_examples",
    )
    return "; ".join(f"{k} {task[k]}" for k in keys if task.get(k) is not None)


def _plain_text(plain: Mapping[str, Any]) -> str:
    if not plain:
        return "The plain sweep has not finished."
    parts = [f"Plain best learning-rate multiplier x{plain['best_lr_multiplier']:g}"]
    if plain.get("eval_loss") is not None:
        parts.append(f"final eval loss {plain['eval_loss']:.4f} (median over seeds {plain['seeds']})")
    if plain.get("seed_spread_eval_loss") is not None:
        parts.append(f"seed spread {plain['seed_spread_eval_loss']:.4f}")
    parts.append(
        f"seed band ±{plain['seed_band']:.2f}x"
        if plain.get("seed_band") is not None
        else "seed band unknown (one seed)"
    )
    if plain.get("clock_noise") is not None:
        parts.append(f"clock noise ±{plain['clock_noise']:.1%} (the sweep's runs did identical work)")
    return "; ".join(parts) + "."


def plot(data: Mapping[str, Any], path: Path) -> Path:
    """Eval loss against compute units (left) and time (right): the plain frontier of every seed and
    every method's run at its chosen rate, its evaluations along the way."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(13, 4.8), dpi=100)
    FigureCanvasAgg(figure)
    axes = [figure.add_subplot(1, 2, i) for i in (1, 2)]
    runs = data["runs"]
    plain = data.get("plain") or {}
    best = plain.get("best_lr_multiplier")
    for axis, cost, label in (
        (axes[0], "units", "compute (forward units)"),
        (axes[1], "seconds", "training time (s)"),
    ):
        for seed in sorted({r["seed"] for r in runs}):
            points = frontier(runs, seed, best) if best is not None else []
            if points:
                axis.plot(
                    [p[cost] for p in points],
                    [p["eval_loss"] for p in points],
                    "-o",
                    color="C0",
                    ms=4,
                    lw=1.5,
                    alpha=0.9,
                    label="plain frontier" if seed == runs[0]["seed"] else None,
                )
        for index, row in enumerate(data.get("verdicts", [])[1:]):
            mine = [
                r for r in runs if r["method"] == row["method"] and r["lr_multiplier"] == row["lr_multiplier"]
            ]
            for n, r in enumerate(mine):
                xs = [p[cost] for p in r["curve"]]
                axis.plot(
                    xs,
                    [p["eval_loss"] for p in r["curve"]],
                    "--s",
                    color=f"C{index + 1}",
                    ms=3,
                    lw=1,
                    label=f"{row['method']} ({row['verdict']})" if n == 0 else None,
                )
        axis.set_xlabel(label)
        axis.set_ylabel("eval loss")
        axis.set_title(f"{data['task'].get('name')}: eval loss vs {label}")
    axes[0].legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, format="png")
    return path
