"""`report.md` and `arena.png`, generated from the record (never edited by hand)."""

from __future__ import annotations

import math
import shlex
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .budget import BUDGETS
from .verdicts import ONE_SEED_BAND

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
        "| eval loss − plain | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in data.get("verdicts", []):
        seeds = ", ".join(str(s) for s in row["seeds"])
        units = "same trajectory" if row.get("same_trajectory") else _speedup_text(row, "speedup_units")
        time = _speedup_text(row, "speedup_time")
        if row.get("speedup_time_within_clock_noise"):
            time += " ~"
        verdict = row["verdict"] + (f" (stopped at {row['stopped_at']:g})" if row.get("stopped_at") else "")
        factor = row.get("lr_multiplier_of_plain_best", 1.0)
        lines.append(
            f"| `{row['method']}` | x{factor:g} | {seeds} | {units} | {time} "
            f"| {row['final_loss_delta']:+.4f} | **{verdict}** |"
        )
    return lines


def _mark(kinds: set[str | None]) -> str:
    """`>` when every reading is a lower bound, `<` when every one is an upper bound, else nothing."""
    return {"lower_bound": ">", "upper_bound": "<"}.get(next(iter(kinds)), "") if len(kinds) == 1 else ""


def _bound_mark(row: Mapping[str, Any], key: str) -> str:
    return _mark({r.get(f"{key}_kind") for r in row.get("per_seed") or []})


def _speedup_text(row: Mapping[str, Any], key: str) -> str:
    per_seed = row.get("per_seed") or []
    text = _bound_mark(row, key) + f"{row[key]:.2f}x"
    if len(per_seed) > 1:
        values = [r[key] for r in per_seed]
        text += f" ({min(values):.2f}–{max(values):.2f})"
    return text


def curve_table(data: Mapping[str, Any]) -> list[str]:
    """Each method's unit speed-up at every budget it reached (first seed), against the per-budget plain
    frontier."""
    rows = [v for v in data.get("verdicts", []) if v.get("curve")]
    if not rows:
        return []
    head = " | ".join(f"{b:g}" for b in BUDGETS)
    lines = [f"| method (first seed) | {head} |", "|---|" + "---|" * len(BUDGETS)]
    for row in rows:
        by_budget = {c["budget"]: c for c in row["curve"]}
        cells = [_cell(by_budget[b], row["lr_multiplier"]) if b in by_budget else "–" for b in BUDGETS]
        lines.append(f"| `{row['method']}` | " + " | ".join(cells) + " |")
    return lines


def _cell(point: Mapping[str, Any], verdict_rate: float) -> str:
    """One budget's reading; its rate when that budget's race chose another than the verdict's."""
    mark = _mark({point.get("speedup_units_kind")})
    rate = point.get("lr_multiplier", verdict_rate)
    at = f" at x{rate:g}" if rate != verdict_rate else ""
    return f"{mark}{point['speedup_units']:.2f}x ({point['loss_delta']:+.3f}){at}"


def markdown(data: Mapping[str, Any]) -> str:
    task, calibration = data["task"], data.get("calibration") or {}
    units = ", ".join(f"{k} {v:.2f}" for k, v in (calibration.get("units") or {}).items())
    lines = [
        f"# hf-hybrid bench — {task.get('name')}",
        "",
        f"Command: `{data['command']}`  ",
        f"Machine: {data['machine']}  ",
        f"Task: {_task_text(task)}",
        "",
        "Speed-up = the plain Trainer's cost to reach the method's eval loss, read off its frontier (at each "
        "of 1/4, 1/2, 3/4 and all of the budget, the plain run at that budget's own tuned learning rate: a "
        "cooldown branch of one warmup-stable-decay trunk) / the method's cost; the median over seeds, with "
        "the range. Compute units are forward passes, each kind of step priced by timing it on this task "
        f"({units}); time is the process's CPU time on CPU, wall-clock on CUDA, evaluation and checkpoints "
        "excluded. `>` marks a lower bound (better than every frontier point), `<` an upper bound (worse "
        "than the cheapest), `~` a time ratio within the clock noise.",
        "",
        *verdict_table(data),
        "",
        *_plain_lines(data),
        "",
        "Verdict: `wins` = every seed above 1.0x and above 1 + the plain seed band (how far one seed's "
        "plain run reads from 1.0x on another seed's frontier); `loses` = every seed below 1 − that band, or "
        "one seed below 1 − twice the band (with one seed and no band: below "
        f"{1 - ONE_SEED_BAND:g}x), or stopped at 1/2 below 1 − twice the band; `ties` otherwise — one seed "
        "cannot show a win. Other seeds run only where they can change a verdict.",
    ]
    lines += ["", *recommendation(data)]
    curves = curve_table(data)
    if curves:
        lines += [
            "",
            "Speed-up at every budget (first seed; eval loss − plain's at that budget; each budget at the "
            "rate its race chose, named where it is not the verdict's):",
            "",
            *curves,
        ]
    lines += _notes(data)
    lines += _runs(data)
    return "\n".join(lines) + "\n"


def recommendation(data: Mapping[str, Any]) -> list[str]:
    """What to do next, in words and code: the winner (or plain) at its rate, the command that turns a
    one-seed tie into a verdict, and what the tuned rate alone buys over the base rate."""
    verdicts = [v for v in data.get("verdicts", []) if v["method"] != "plain"]
    plain = data.get("plain") or {}
    if not plain:
        return []
    base = (data.get("decisions") or {}).get("base_learning_rate") or data["task"].get("learning_rate")
    steps = data["task"].get("max_steps")
    protocol = data.get("protocol") or {}
    check = (data.get("decisions") or {}).get("schedule_check") or {}
    own = (
        (check.get("schedule") or data["task"].get("lr_scheduler_type") or "linear")
        if _separate(data)
        else None
    )
    winners = sorted(
        (v for v in verdicts if v["verdict"] == "wins" and not v.get("null_control_of")),
        key=lambda v: -v["speedup_units"],
    )
    lines = ["## What to do next", ""]
    if winners:
        best = winners[0]
        rate = base * best["lr_multiplier"]
        budget = best.get("budget", 1.0)
        at = _steps_at(protocol, budget, steps)
        lines.append(
            f"`{best['method']}` wins: {best['speedup_units']:.2f}x in compute units over the tuned plain "
            f"Trainer, on every seed run. Train with it at learning rate {rate:.3g}{_overfits(budget, at)}:"
        )
        lines += ["", "```python", *_arguments(best["method"], rate, at, protocol, own), "```"]
    else:
        budget = plain.get("best_budget", 1.0)
        rate = base * plain["best_lr_multiplier"][str(budget)]
        at = _steps_at(protocol, budget, steps)
        lines.append(
            f"No method wins here: keep the plain Trainer, at its tuned learning rate {rate:.3g} for "
            f"{at} steps{_overfits(budget, at)}:"
        )
        lines += ["", "```python", *_arguments("plain", rate, at, protocol, own), "```"]
    contenders = [
        v["method"]
        for v in verdicts
        if len(v["seeds"]) == 1
        and v["verdict"] == "ties"
        and v["speedup_units"] > 1.0
        and not v.get("stopped_at")
        and not v.get("null_control_of")  # a control explains a method; it is not one to adopt
    ]
    if contenders and len(plain.get("seeds") or []) < 2:
        flags = {"--seeds": ["0", "1", "2"], "--methods": ["plain", *contenders]}
        command = _replace_flags(data["command"], flags)
        lines += ["", "One seed cannot show a win. To turn the ties above 1.0x into verdicts:", ""]
        lines.append(f"    {command}")
    gain = _tuning_gain(data, base)
    if gain:
        lines += ["", gain]
    return lines


def _steps_at(protocol: Mapping[str, Any], budget: float, steps: Any) -> Any:
    """A budget's steps as the arena ran them (the full budget's when the record does not say)."""
    return (protocol.get("budgets") or {}).get(str(float(budget)), {}).get("steps", steps)


def _overfits(budget: float, steps: Any) -> str:
    """Why a recommendation stops short of the full budget: the eval loss is lowest there."""
    if budget >= 1.0:
        return ""
    return f" (its eval loss is lowest at {budget:g} of the budget, {steps} steps: longer training overfits)"


def _replace_flags(command: str, flags: Mapping[str, list[str]]) -> str:
    """`command` with each of `flags` given these values instead of its own (or added at the end)."""
    words, out, skipping = shlex.split(command), [], False
    for word in words:
        if word.startswith("--"):
            skipping = word in flags
        if not skipping:
            out.append(word)
    for flag, values in flags.items():
        out += [flag, *values]
    return shlex.join(out)


def _arguments(
    method: str, rate: float, steps: Any, protocol: Mapping[str, Any], own_schedule: str | None = None
) -> list[str]:
    """The arguments of a run like the arena's: its schedule (the task's own where the record fell back to
    it), its rate and the method's own settings."""
    decay = protocol.get("cooldown_fraction", 0.2)
    schedule = (
        f'lr_scheduler_type="warmup_stable_decay", lr_scheduler_kwargs={{"num_decay_steps": '
        f'{round(decay * (steps or 0))}, "decay_type": "{protocol.get("decay_shape", "1-sqrt")}"}}'
    )
    if own_schedule is not None:
        schedule = f'lr_scheduler_type="{own_schedule}"'
    name, _, options = method.partition(":")
    fields = [f"learning_rate={rate:.3g}", f"max_steps={steps}", schedule]
    if name == "args":
        fields += [
            f"{k}={v!r}" if not v.replace(".", "").isdigit() else f"{k}={v}" for k, v in _pairs(options)
        ]
    if name in ("hybrid", "hybrid-predict"):
        overrides = [f"{k if k.startswith('hybrid_') else 'hybrid_' + k}={v}" for k, v in _pairs(options)]
        preset = "" if name == "hybrid" else "  # hybrid-predict: see `hf-hybrid bench --list_methods`"
        return [f'args = HybridTrainingArguments(output_dir="out", {", ".join(fields + overrides)}){preset}']
    lines = [f'args = TrainingArguments(output_dir="out", {", ".join(fields)})']
    if name == "freeze":
        lines.append(
            f"hf_hybrid.bench.methods.freeze.freeze_bottom(model, {options})  # embeddings + {options} blocks"
        )
    if name == "peft":
        lines.append("model = peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=16))")
    return lines


def _pairs(options: str) -> list[tuple[str, str]]:
    return [tuple(item.split("=", 1)) for item in options.split(",") if "=" in item]


def _tuning_gain(data: Mapping[str, Any], base: float) -> str | None:
    """How much cheaper the tuned plain run reaches the base rate's loss (x1, at its longest budget)."""
    from .frontier import speedup

    plain = data.get("plain") or {}
    best = {float(b): m for b, m in (plain.get("best_lr_multiplier") or {}).items()}
    points = [_plain_point(data, 0, best[b], b) for b in BUDGETS if b in best]
    points = [p for p in points if p is not None]
    separate = _separate(data)
    mine = [
        r
        for r in data["runs"]
        if r["method"] == "plain"
        and r["seed"] == 0
        and r["lr_multiplier"] == 1.0
        and r["point"]
        and r.get("eval_loss") is not None
        and math.isfinite(r["eval_loss"])
        and (r["kind"] == "separate") == separate
    ]
    given = (data.get("task") or {}).get("learning_rate") is not None  # not a range test's centre
    if not given or not mine or len(points) < 2 or best.get(1.0) == 1.0:
        return None
    longest = max(mine, key=lambda r: r["budget"])
    reading = speedup([(p["units"], p["eval_loss"]) for p in points], longest["eval_loss"], longest["units"])
    if reading.ratio <= 0:
        return None
    bound = {"upper_bound": ">", "lower_bound": "<"}.get(reading.kind, "")  # the ratio is inverted here
    return (
        f"The tuned rate alone: the base rate {base:.3g} reached eval loss {longest['eval_loss']:.4f} at "
        f"{longest['budget']:g} of the budget; the tuned plain frontier reaches it {bound}"
        f"{1 / reading.ratio:.2f}x cheaper (compute units)."
    )


def _plain_lines(data: Mapping[str, Any]) -> list[str]:
    plain, decisions = data.get("plain") or {}, data.get("decisions") or {}
    if not plain:
        return ["The plain sweep has not finished."]
    best = plain["best_lr_multiplier"]
    base = decisions.get("base_learning_rate")
    rates = ", ".join(f"{float(b):g}: x{m:g}" for b, m in best.items())
    lines = [
        f"Plain's best rate per budget (x the base rate {base:g}): {rates}."
        if base
        else f"Plain's best rate per budget: {rates}."
    ]
    for budget, why in (plain.get("untuned") or {}).items():
        lines.append(f"**The judge is not tuned at {float(budget):g} of the budget**: {why}.")
    parts = [f"final eval loss {plain['eval_loss']:.4f} (median over seeds {plain['seeds']})"]
    if plain.get("seed_spread_eval_loss") is not None:
        parts.append(f"seed spread {plain['seed_spread_eval_loss']:.4f}")
    if plain.get("seed_band") is not None:
        band = f"seed band ±{plain['seed_band']:.2f}x"
        if plain.get("seed_band_eval_noise") is not None:
            band += f" (eval noise alone ±{plain['seed_band_eval_noise']:.2f}x, training noise the rest)"
        parts.append(band)
    else:
        parts.append("seed band unknown (one seed)")
    if plain.get("clock_noise") is not None:
        parts.append(f"clock noise ±{plain['clock_noise']:.1%} (plain full-budget runs: identical work)")
    lines.append("; ".join(parts) + ".")
    check = decisions.get("schedule_check") or {}
    if check:
        verdict = (
            "the trunk was worse beyond twice the eval noise: every run fell back to separate, fully decayed "
            "runs with the task's schedule"
            if check["fallback"]
            else "the trunk is not worse beyond twice the eval noise: its branches are the frontier"
        )
        lines.append(
            "Schedule check: the warmup-stable-decay trunk's full-budget eval loss "
            f"{check['trunk_eval_loss']:.4f} against {check['own_schedule_eval_loss']:.4f} with the task's "
            f"own `{check['schedule']}` schedule "
            f"(at x{check['own_schedule_lr_multiplier']:g}, its best of three rates; paired eval noise "
            f"±{check['paired_eval_noise']:.4f}): {verdict}."
        )
    return lines


def _notes(data: Mapping[str, Any]) -> list[str]:
    """Notes of the runs grouped by text, with how many runs said each."""
    counts = Counter((r["method"], r["note"]) for r in data["runs"] if r.get("note"))
    lines = []
    if counts:
        lines += ["", "Notes from the runs:"]
        lines += [f"- `{m}`: {n}" + (f" ({c} runs)" if c > 1 else "") for (m, n), c in sorted(counts.items())]
    if data.get("notes"):
        lines += ["", "Notes from the arena:"] + [f"- {n}" for n in data["notes"]]
    return lines


def _runs(data: Mapping[str, Any]) -> list[str]:
    unused = set(data.get("unused") or ())
    lines = [
        "",
        "Runs (eval loss where evaluated; units and seconds from step 0):",
        "",
        "| method | lr | seed | kind | steps | eval loss | units | seconds | |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in data["runs"]:
        loss = "failed" if r.get("error") else "" if r["eval_loss"] is None else f"{r['eval_loss']:.4f}"
        flag = "no longer in the plan" if r["key"] in unused else ""
        if r.get("reused_from"):
            flag = "reused: provably the plain run"
        lines.append(
            f"| `{r['method']}` | {r['learning_rate']:.3g} | {r['seed']} | {r['kind']} "
            f"| {r['start']}–{r['stop']} of {r['steps']} | {loss} | {r['units']:.0f} | {r['seconds']:.1f} "
            f"| {flag} |"
        )
    return lines


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


# ---- the picture ------------------------------------------------------------------------------------


def panel_of(method: str) -> str:
    """The plot panel a method is drawn in: its family's (a null control with its method's family, an
    `args:` change alone)."""
    if method.startswith("null-hybrid"):
        return "hybrid"
    if method.startswith("selective-backprop"):
        return "selective-backprop"
    if method.startswith("args:"):
        return method
    return method.split(":", 1)[0].replace("hybrid-predict", "hybrid")


def short_label(row: Mapping[str, Any], limit: int = 30) -> str:
    """A label that fits beside a plot: the method's name and its options shortened; a null control
    named by its method (the full specs are in report.md)."""
    parent = row.get("null_control_of")
    if parent:
        return "null of " + short_label({"method": parent}, limit - 8)
    name, _, options = row["method"].partition(":")
    options = options.replace("hybrid_", "")
    text = f"{name}:{options}" if options else name
    return text if len(text) <= limit else text[: limit - 1] + "…"


def plot(data: Mapping[str, Any], path: Path) -> Path:
    """Left: each method's speed-up (median and seed range) against 1.0x, the plain seed band shaded, the
    verdict beside it. Right: eval loss against compute, one small panel per method family with the plain
    frontier in each (the median over seeds), the axes set by the plain frontier."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not data.get("verdicts"):
        return _progress_plot(data, path)
    rows = [v for v in data.get("verdicts", []) if v["method"] != "plain"]
    families: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        families.setdefault(panel_of(row["method"]), []).append(row)
    panels = max(1, len(families))
    grid_rows = max(2, -(-panels // 2))
    figure = Figure(figsize=(15, max(5.0, 0.42 * len(rows) + 2.0, 2.6 * grid_rows)), dpi=100)
    FigureCanvasAgg(figure)
    grid = figure.add_gridspec(grid_rows, 4)
    _forest(figure.add_subplot(grid[:, :2]), rows, (data.get("plain") or {}).get("seed_band"))
    frontier = _median_frontier(data)
    for index, (name, members) in enumerate(families.items()):
        axis = figure.add_subplot(grid[index // 2, 2 + index % 2])
        _family_panel(axis, data, name, members, frontier)
    figure.suptitle(
        f"{data['task'].get('name')}: speed-up at equal eval loss against the tuned plain Trainer"
    )
    figure.tight_layout()
    figure.savefig(path, format="png")
    return path


def _progress_plot(data: Mapping[str, Any], path: Path) -> Path:
    """An arena still running has no verdict to draw: its evaluated points so far instead, eval loss
    against compute on the first seed, plain's sweep (one line per rate) beside the methods (one line per
    method and rate), both framed by plain's points, so that a stopped arena still shows where it stands."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    seeds = (data.get("protocol") or {}).get("seeds") or [0]
    points = [
        r
        for r in data.get("runs", [])
        if r.get("point") and r["seed"] == seeds[0] and r["kind"] != "separate"
        if r.get("eval_loss") is not None
    ]
    lines: dict[tuple[str, float], list[Mapping[str, Any]]] = {}
    for row in sorted(points, key=lambda r: r["budget"]):
        lines.setdefault((row["method"], row["lr_multiplier"]), []).append(row)
    figure = Figure(figsize=(12, 5), dpi=100)
    FigureCanvasAgg(figure)
    plain_axis, method_axis = figure.add_subplot(1, 2, 1), figure.add_subplot(1, 2, 2)
    for index, ((method, rate), rows) in enumerate(sorted(lines.items())):
        axis = plain_axis if method == "plain" else method_axis
        axis.plot(
            [r["units"] for r in rows], [r["eval_loss"] for r in rows], "-o", ms=3, lw=1,
            color=f"C{index % 10}", label=f"{short_label({'method': method}, 24)} x{rate:g}",
        )  # fmt: skip
    plain_losses = [r["eval_loss"] for (m, _), rows in lines.items() if m == "plain" for r in rows]
    best: dict[float, Mapping[str, Any]] = {}
    for row in (r for (m, _), rows in lines.items() if m == "plain" for r in rows):
        if row["budget"] not in best or row["eval_loss"] < best[row["budget"]]["eval_loss"]:
            best[row["budget"]] = row
    if best:
        frontier = [best[b] for b in sorted(best)]
        method_axis.plot(
            [r["units"] for r in frontier], [r["eval_loss"] for r in frontier], "-o", color="k", ms=3, lw=1.5,
            label="plain, best rate so far per budget",
        )  # fmt: skip
    finite = [loss for loss in plain_losses if math.isfinite(loss)]
    for axis, title in ((plain_axis, "plain sweep, seed {}"), (method_axis, "methods, seed {}")):
        axis.set_title(title.format(seeds[0]), fontsize=9)
        axis.set_xlabel("compute units", fontsize=8)
        axis.set_ylabel("eval loss", fontsize=8)
        if finite:
            pad = 0.3 * (max(finite) - min(finite) or 0.1)
            axis.set_ylim(min(finite) - pad, max(finite) + pad)
        if axis.lines:
            axis.legend(fontsize=6)
        else:
            axis.text(0.5, 0.5, "no evaluated point yet", ha="center", transform=axis.transAxes)
    figure.suptitle(
        f"{data['task'].get('name')}: in progress, {len(data.get('runs', []))} runs recorded, no verdict "
        "yet (the same command resumes it)"
    )
    figure.tight_layout()
    figure.savefig(path, format="png")
    return path


def _forest(axis: Any, rows: Sequence[Mapping[str, Any]], band: float | None) -> None:
    if band:
        axis.axvspan(1 - band, 1 + band, color="0.9", label=f"plain seed band ±{band:.2f}")
    axis.axvline(1.0, color="0.4", lw=1)
    colours = {"wins": "C2", "loses": "C3", "ties": "C0"}
    for index, row in enumerate(rows):
        key = "speedup_time" if row.get("same_trajectory") else "speedup_units"  # its verdict's own
        values = [r[key] for r in row["per_seed"]]
        y = len(rows) - index
        colour = colours.get(row["verdict"], "C7")
        axis.plot([min(values), max(values)], [y, y], color=colour, lw=2)
        axis.plot([row[key]], [y], "D" if row.get("same_trajectory") else "o", color=colour)
        stopped = f" @{row['stopped_at']:g}" if row.get("stopped_at") else ""
        seeds = f", {len(values)} seeds" if len(values) > 1 else ""
        in_time = " in time" if row.get("same_trajectory") else ""
        axis.annotate(
            f"{_bound_mark(row, key)}{row[key]:.2f}x{in_time} {row['verdict']}{stopped}{seeds}",
            (max(values), y),
            xytext=(6, -3),
            textcoords="offset points",
            fontsize=8,
        )
    axis.set_yticks(range(len(rows), 0, -1), [short_label(r) for r in rows], fontsize=8)
    axis.set_xlabel("speed-up in compute units (x the tuned plain Trainer; median, seed range)")
    high = max(
        [1.5, *(max(r["speedup_units"], r.get("speedup_time", 0)) for row in rows for r in row["per_seed"])]
    )
    axis.set_xlim(0, min(high * 1.45, 4.0))
    if band:
        axis.legend(fontsize=8, loc="lower right")


def _median_frontier(data: Mapping[str, Any]) -> list[tuple[float, float]]:
    """(units, eval loss) of the plain frontier at each budget, the median over seeds."""
    plain = data.get("plain") or {}
    best = {float(b): m for b, m in (plain.get("best_lr_multiplier") or {}).items()}
    out = []
    for budget in BUDGETS:
        points = [_plain_point(data, s, best[budget], budget) for s in plain.get("seeds") or []]
        points = [p for p in points if p is not None] if budget in best else []
        if points:
            out.append(
                (
                    statistics.median(p["units"] for p in points),
                    statistics.median(p["eval_loss"] for p in points),
                )
            )
    return out


def _family_panel(
    axis: Any,
    data: Mapping[str, Any],
    name: str,
    members: Sequence[Mapping[str, Any]],
    frontier: Sequence[tuple[float, float]],
) -> None:
    if frontier:
        axis.plot(
            *zip(*frontier, strict=True), "-o", color="k", ms=3, lw=1.5, label="plain (tuned per budget)"
        )
    for index, row in enumerate(members):
        points = [_method_point(data["runs"], row, c) for c in row.get("curve") or []]
        points = [p for p in points if p is not None]
        if points:
            axis.plot(
                [p["units"] for p in points],
                [p["eval_loss"] for p in points],
                "--s",
                color=f"C{index % 10}",
                ms=3,
                lw=1,
                label=short_label(row, 24),
            )
    axis.set_title(name if len(name) <= 32 else name[:31] + "…", fontsize=9)
    axis.tick_params(labelsize=7)
    notes = [
        f"{short_label(r, 24)}: same trajectory, {r['speedup_time']:.2f}x in time"
        for r in members
        if r.get("same_trajectory")
    ]
    if frontier:
        losses = [loss for _, loss in frontier]
        pad = 0.3 * (max(losses) - min(losses) or abs(max(losses)) * 0.05 or 0.1)
        low, high = min(losses) - pad, max(losses) + pad
        axis.set_ylim(low, high)
        axis.set_xlim(0, max(units for units, _ in frontier) * 1.25)
        notes += [
            f"{short_label(r, 24)}: above the frame (eval loss {r['final_loss_delta']:+.2f} vs plain)"
            for r in members
            if r.get("curve") and all(_off_frame(data, r, c, high) for c in r["curve"])
        ]
    if notes:
        axis.text(0.02, 0.03, "\n".join(notes), transform=axis.transAxes, fontsize=6, va="bottom")
    axis.legend(fontsize=6)


def _off_frame(
    data: Mapping[str, Any], row: Mapping[str, Any], reading: Mapping[str, Any], high: float
) -> bool:
    point = _method_point(data["runs"], row, reading)
    return point is None or point["eval_loss"] > high


def _separate(data: Mapping[str, Any]) -> bool:
    """The record fell back to separate, fully decayed runs in the task's own schedule (or asked for them)."""
    return (data.get("decisions") or {}).get("mode") == "separate"


def _plain_point(data: Mapping[str, Any], seed: int, multiplier: float, budget: float):
    """Plain's frontier point: a branch or trunk segment, or in separate mode that budget's separate run."""
    separate = _separate(data)
    found = [
        r
        for r in data["runs"]
        if r["method"] == "plain"
        and r["seed"] == seed
        and r["lr_multiplier"] == multiplier
        and r["budget"] == budget
        and r["point"]
        and r.get("eval_loss") is not None
        and math.isfinite(r["eval_loss"])
        and (r["kind"] == "separate") == separate
    ]
    return found[0] if found else None


def _method_point(runs: Sequence[Mapping[str, Any]], row: Mapping[str, Any], reading: Mapping[str, Any]):
    """The recorded run behind one reading of a method's curve (each budget at its own rate)."""
    found = [
        r
        for r in runs
        if r["method"] == row["method"]
        and r["seed"] == row["seeds"][0]
        and r["lr_multiplier"] == reading.get("lr_multiplier", row["lr_multiplier"])
        and r["budget"] == reading["budget"]
        and r["point"]
        and r.get("eval_loss") is not None
    ]
    return found[0] if found else None
