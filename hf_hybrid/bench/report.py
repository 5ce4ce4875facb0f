"""`report.md` and `arena.png`, generated from the record (never edited by hand)."""

from __future__ import annotations

import math
import shlex
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from .frontier import envelope
from .protocol import BUDGETS, CONFIDENCE, EVAL_FACTORS, TARGET_RESOLUTION

REPORT_FILE = "report.md"
PLOT_FILE = "arena.png"
MARKS = {"lower_bound": ">", "upper_bound": "<"}


def write_report(data: Mapping[str, Any], out: str | Path) -> dict[str, Path]:
    out = Path(out)
    paths = {"json": out / "results.json", "markdown": out / REPORT_FILE, "plot": out / PLOT_FILE}
    paths["markdown"].write_text(markdown(data))
    plot(data, paths["plot"])
    return paths


def speedup_text(row: Mapping[str, Any], key: str = "speedup_units") -> str:
    """A speed-up with its bound mark (`>` better than every plain point, `<` worse than the cheapest);
    a time speed-up that was not measured side by side with plain's says so."""
    if key == "speedup_units" and row.get("same_trajectory"):
        return "same trajectory"
    if row.get(key) is None:
        return "not timed side by side" if key == "speedup_time" else "–"
    return MARKS.get(row.get(f"{key}_kind") or "", "") + f"{row[key]:.2f}x"


def band_text(row: Mapping[str, Any]) -> str:
    band = row.get("band") or {}
    if band.get("low") is None or band.get("high") is None or not math.isfinite(band["high"]):
        return "–"
    return f"{band['low']:.2f}–{band['high']:.2f}x"


def verdict_table(data: Mapping[str, Any]) -> list[str]:
    lines = [
        "| method | lr (x plain's) | seeds | speed-up, units | speed-up, time | eval loss − plain | band "
        "| verdict | cost (plain runs) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in data.get("verdicts", []):
        seeds = ", ".join(str(s) for s in row["seeds"])
        verdict = row["verdict"] + (f" (stopped at {row['stopped_at']:g})" if row.get("stopped_at") else "")
        if row.get("engaged") is False:
            verdict += ", never engaged"
        lines.append(
            f"| `{row['method']}` | x{row.get('lr_multiplier_of_plain', 1.0):g} | {seeds} "
            f"| {speedup_text(row)} | {speedup_text(row, 'speedup_time')} | {row['loss_delta']:+.4f} "
            f"| {band_text(row)} | **{verdict}** | {row.get('cost_plain_runs', 0.0):.2f} |"
        )
    return lines


def what_would_reach(res: Mapping[str, Any]) -> str:
    """What would bring a task's resolution to the target: more seeds, more eval clusters, or both."""
    wants = []
    if res.get("seeds_for_target"):
        wants.append(f"{res['seeds_for_target']} seeds")
    if res.get("eval_factor_for_target"):
        wants.append(f"{res['eval_factor_for_target']:.1f}x the eval clusters at {res['seeds']} seed(s)")
    both = [f"{n} seeds with {k:g}x the eval clusters" for n, k in res.get("seeds_and_eval_for_target", [])]
    if wants:
        return " or ".join(wants)
    if both:
        return "both more seeds and more eval data: " + ", or ".join(both)
    most = max(EVAL_FACTORS)
    return f"neither more seeds nor more eval data alone, nor both within {most:g}x the eval clusters"


def resolution_lines(data: Mapping[str, Any]) -> list[str]:
    """The task's resolution and what would shrink it, in numbers."""
    res = (data.get("plain") or {}).get("resolution")
    if not res:
        return []
    if res["slope"] <= 0:
        return [
            "**Resolution: none** — plain's eval loss no longer falls at the budget the verdicts read, so no "
            "speed-up can be read: a budget that ends where plain still improves, or more training data, "
            "would be needed."
        ]
    if res["seed_se"] is None:
        lines = [
            "**Resolution: unknown at 1 seed** — the smallest speed-up this judge tells from 1.0x joins "
            "the plain seeds' run-to-run spread, which one seed cannot show: rerun with `--seeds 0 1 2`, "
            f"and the report states it and what would bring it to {TARGET_RESOLUTION:g}x."
        ]
    else:
        clusters = f" over {res['eval_clusters']} documents" if res.get("eval_clusters") else ""
        lines = [
            f"**Resolution: {res['resolution']:.2f}x** at {res['seeds']} seed(s) — the smallest speed-up "
            f"this judge tells from 1.0x (a two-sided {2 * CONFIDENCE - 1:.0%} t interval at "
            f"{res.get('df', math.inf):.1f} degrees of freedom of: the seeds' run-to-run part "
            f"{res['seed_se']:.4f} (t at {res.get('seed_df', res['seeds'] - 1):g} degrees of freedom) and "
            f"the eval set's clustered part{clusters} {res['eval_se']:.4f} of a loss difference, read at "
            f"{res['slope']:.4f} (±{res.get('slope_se', 0.0):.4f}) of loss per e-fold of cost; the budget "
            f"grid's {res['grid']:.3f} in log cost)."
        ]
        if res["resolution"] > TARGET_RESOLUTION:
            lines.append(f"To resolve {TARGET_RESOLUTION:g}x it would take {what_would_reach(res)}.")
    if not data.get("eval_clusters"):
        lines.append(
            "The eval noise counts every eval example as independent. Examples cut from one file or document "
            "move together, so if yours are, name their document (`--eval_group_column`): the band widens "
            "to the truth."
        )
    return lines


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
        f"Each method's speed-up is read at {_reading_text(data)}: its eval loss, paired seed by seed "
        "with plain's, is read on plain's frontier (the first seed's plain run at each budget's raced "
        "rate) as the cost plain needs to get there, over the method's cost. Compute units are forward "
        f"passes, each kind of step priced by timing it on this task ({units}); time is the process's CPU "
        "time on CPU, wall-clock on CUDA, evaluation and checkpoints excluded, and is read only where the "
        "method's runs and plain's ran in one invocation. `>` marks a lower bound (better than every "
        "plain point), `<` an upper bound. A verdict wins or loses only outside its band.",
        "",
        *verdict_table(data),
        "",
        *resolution_lines(data),
        "",
        *_plain_lines(data),
        "",
        *recommendation(data),
    ]
    for row in data.get("verdicts", []):
        if row["method"] != "plain":
            lines.append(f"- `{row['method']}`: {row['verdict']}: {row['reason']}{_rising_text(row)}")
    rules = (data.get("protocol") or {}).get("rules") or {}
    if rules:
        lines += ["", "The protocol's rules as this record ran them:", "", "| rule | value |", "|---|---|"]
        lines += [f"| {rule} | {value} |" for rule, value in rules.items()]
    lines += _notes(data)
    lines += _runs(data)
    return "\n".join(lines) + "\n"


def _reading_text(data: Mapping[str, Any]) -> str:
    read_at = (data.get("plain") or {}).get("read_at", 1.0)
    if read_at == 1.0:
        return "the full budget"
    return f"{read_at:g} of the budget (plain's own eval loss rose after it: fixed from plain's runs alone)"


def rising(row: Mapping[str, Any]) -> tuple[Mapping[str, Any], Mapping[str, Any]] | None:
    """(the lowest point from 1/2 of the budget on, the last point) where the method's eval loss rises
    after it: the method overtrains toward the full budget (its best run is a shorter one)."""
    later = [c for c in row.get("curve") or [] if c["budget"] >= 0.5 and c.get("eval_loss") is not None]
    if len(later) < 2:
        return None
    best = min(later, key=lambda c: c["eval_loss"])
    return (best, later[-1]) if later[-1]["eval_loss"] > best["eval_loss"] else None


def _rising_text(row: Mapping[str, Any]) -> str:
    found = rising(row)
    if found is None:
        return ""
    best, last = found
    return (
        f"; its eval loss rises toward the full budget ({best['budget']:g}: {best['eval_loss']:.4f} → "
        f"{last['budget']:g}: {last['eval_loss']:.4f}): a shorter run of it gives a better model"
    )


def recommendation(data: Mapping[str, Any]) -> list[str]:
    """What to do next, in words and code: the winner (or plain) at its rate."""
    plain = data.get("plain") or {}
    if not plain:
        return []
    base = (data.get("decisions") or {}).get("base_learning_rate") or data["task"].get("learning_rate")
    steps = data["task"].get("max_steps")
    protocol = data.get("protocol") or {}
    own = plain.get("mode") == "separate" and (data["task"].get("lr_scheduler_type") or "linear")
    winners = sorted(
        (v for v in data.get("verdicts", []) if v["verdict"] == "wins" and not v.get("null_control_of")),
        key=lambda v: -(v["speedup_time"] or 0.0) if v.get("same_trajectory") else -v["speedup_units"],
    )
    lines = ["## What to do next", ""]
    if winners:
        best = winners[0]
        rate = base * best["lr_multiplier"]
        lines.append(f"{_win_text(best)} Train with it at learning rate {rate:.3g}:")
        row_length = data["task"].get("seq_len")
        lines += [
            "",
            "```python",
            *arguments(best["method"], rate, steps, protocol, own or None, row_length),
            "```",
        ]
        lines += trl_lines(best["method"])
    else:
        rate = base * plain["best_lr_multiplier"][str(1.0)]
        lines.append(f"No method wins here: keep the plain Trainer, at its raced learning rate {rate:.3g}:")
        lines += ["", "```python", *arguments("plain", rate, steps, protocol, own or None), "```"]
    unresolved = [v["method"] for v in data.get("verdicts", []) if v["verdict"] == "unresolved"]
    if unresolved and len(plain.get("seeds") or []) < 2:
        command = _replace_flags(data["command"], {"--seeds": ["0", "1", "2"]})
        lines += ["", "With one seed some verdicts are unresolved; to resolve them:", "", f"    {command}"]
    return lines + [""]


def _win_text(row: Mapping[str, Any]) -> str:
    """Why a winner wins, in its own terms: time for a same-trajectory method; units and time otherwise,
    and what it costs in quality where it ends worse than plain."""
    if row.get("same_trajectory"):
        return (
            f"`{row['method']}` trains plain's trajectory (eval loss {row['loss_delta']:+.4f} at "
            f"{row['budget']:g} of the budget) and wins in time: {speedup_text(row, 'speedup_time')} "
            f"({band_text(row)} over its timed pairs)."
        )
    text = (
        f"`{row['method']}` wins: {speedup_text(row)} in compute units, "
        f"{speedup_text(row, 'speedup_time')} in time, beyond its band."
    )
    if row.get("never_reaches_plain"):
        text += (
            f" It reaches plain's frontier at its own eval loss ({row['loss_delta']:+.4f}), never plain's: "
            f"at the same steps it gives a model {row['loss_delta']:.4f} worse in eval loss than plain; the "
            "speed-up is what plain needs to reach that worse loss."
        )
    return text


def arguments(
    method: str, rate: float, steps: Any, protocol: Mapping[str, Any], own: str | None, row_length: Any = None
) -> list[str]:
    """The code of a run like the arena's: its schedule (the task's own where the record fell back to it),
    its rate and the method's own settings (a packing's collator, rows of the task's `row_length`)."""
    decay = protocol.get("cooldown_fraction", 0.2)
    schedule = (
        f'lr_scheduler_type="warmup_stable_decay", lr_scheduler_kwargs={{"num_decay_steps": '
        f'{round(decay * (steps or 0))}, "decay_type": "{protocol.get("decay_shape", "1-sqrt")}"}}'
    )
    if own is not None:
        schedule = f'lr_scheduler_type="{own}"'
    name, _, options = method.partition(":")
    fields = [f"learning_rate={rate:.3g}", f"max_steps={steps}", schedule]
    pairs = [tuple(item.split("=", 1)) for item in options.split(",") if "=" in item]
    if name == "args":
        fields += [f"{k}={v}" if v.replace(".", "").isdigit() else f"{k}={v!r}" for k, v in pairs]
    if name in ("hybrid", "hybrid-predict"):
        overrides = [f"{k if k.startswith('hybrid_') else 'hybrid_' + k}={v}" for k, v in pairs]
        return [f'args = HybridTrainingArguments(output_dir="out", {", ".join(fields + overrides)})']
    if name == "group_by_length":
        fields.append('train_sampling_strategy="group_by_length"')
    lines = [f'args = TrainingArguments(output_dir="out", {", ".join(fields)})']
    packing = "hf_hybrid.bench.methods.packing"
    collators = {
        "packing": "transformers.DataCollatorWithFlattening()  # no padding, per-example position_ids",
        "packing:rows": f"{packing}.PackedRows({row_length}, tokenizer.pad_token_id)  "
        "# bin-packed rows, per-example position_ids",
        "packing-naive": f"{packing}.ConcatenatedRows({row_length}, tokenizer.pad_token_id)"
        "  # examples end to end, attending to each other",
    }
    if method in collators:
        lines += [
            f"collator = {collators[method]}",
            "trainer = Trainer(model=model, args=args, train_dataset=train, data_collator=collator)",
        ]
    if name == "freeze":
        lines.append(f"hf_hybrid.bench.methods.freeze.freeze_bottom(model, {options})  # embeddings + blocks")
    if name == "peft":
        lines.append("model = peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=16))")
    return lines


# What a TRL user sets for the arena's layout methods (TRL 1.x `SFTConfig`), and where TRL has none.
TRL_LAYOUTS = {
    "packing": (
        [
            "config = SFTConfig(..., padding_free=True)  # each batch flattened to one row, per-example "
            "position_ids"
        ],
        "TRL documents `padding_free` for FlashAttention; transformers 5.24 also builds the block mask for "
        "sdpa from `position_ids`, which is how the arena ran it.",
    ),
    "packing:rows": (
        [
            "config = SFTConfig(..., packing=False, padding_free=False)",
            'trainer = HybridSFTTrainer(..., args=config)  # with hybrid_padding="rows" in its arguments',
        ],
        "TRL has no per-batch bin packing: `packing=True` (`bfd`) packs the dataset ahead of time, which "
        "puts more examples in each step (a different run, whose rate must be raced again).",
    ),
    "packing-naive": (
        ['config = SFTConfig(..., packing=True, packing_strategy="wrapped")  # examples end to end'],
        "TRL's `wrapped` packing also lets examples attend to each other and cuts them mid-sequence; it "
        "packs the dataset ahead of time, so a step holds more examples than the arena's per-batch rows.",
    ),
}


def trl_lines(method: str) -> list[str]:
    """The `SFTConfig` settings that give a winning layout to a TRL user, or where TRL has none."""
    if method not in TRL_LAYOUTS:
        return []
    code, caveat = TRL_LAYOUTS[method]
    return ["", "With TRL's `SFTTrainer`:", "", "```python", *code, "```", "", caveat]


def _replace_flags(command: str, flags: Mapping[str, list[str]]) -> str:
    """`command` with each of `flags` given these values instead of its own (or added at the end)."""
    out, skipping = [], False
    for word in shlex.split(command):
        if word.startswith("--"):
            skipping = word in flags
        if not skipping:
            out.append(word)
    for flag, values in flags.items():
        out += [flag, *values]
    return shlex.join(out)


def _plain_lines(data: Mapping[str, Any]) -> list[str]:
    plain, decisions = data.get("plain") or {}, data.get("decisions") or {}
    if not plain:
        return ["Plain's race has not finished."]
    base = decisions.get("base_learning_rate")
    rates = ", ".join(f"{float(b):g}: x{m:g}" for b, m in plain["best_lr_multiplier"].items())
    losses = ", ".join(f"seed {s} {v:.4f}" for s, v in plain["eval_loss_by_seed"].items())
    lines = [f"Plain's rate per budget (x the base rate {base:g}): {rates}; full-budget eval loss {losses}."]
    for budget, why in (plain.get("untuned") or {}).items():
        lines.append(f"**Plain's race is untuned at {float(budget):g} of the budget**: {why}.")
    check = decisions.get("schedule_check") or {}
    if check:
        verdict = (
            "every run fell back to it" if check["fallback"] else "the trunk's branches stay the frontier"
        )
        lines.append(
            f"Schedule check at x{check['lr_multiplier']:g}, {check['budget']:g} of the budget: the "
            f"trunk's branch's eval loss "
            f"{check['trunk_eval_loss']:.4f}, the task's own `{check['schedule']}` schedule's "
            f"{check['own_schedule_eval_loss']:.4f} (paired eval error ±{check['paired_eval_se']:.4f}): "
            f"{verdict}."
        )
    cost = plain.get("cost_plain_runs") or {}
    if cost:
        parts = ", ".join(f"{k.replace('_', ' ')} {v:.2f}" for k, v in cost.items() if k != "total")
        lines.append(f"Plain's part cost {cost['total']:.2f} plain full runs ({parts}).")
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


def short_label(row: Mapping[str, Any], limit: int = 30) -> str:
    """A label that fits beside a plot: the method's name and options shortened; a null control named
    by its method (the full specs are in report.md)."""
    parent = row.get("null_control_of")
    if parent:
        return "null of " + short_label({"method": parent}, limit - 8)
    name, _, options = row["method"].partition(":")
    text = f"{name}:{options.replace('hybrid_', '')}" if options else name
    return text if len(text) <= limit else text[: limit - 1] + "…"


def frontier_points(data: Mapping[str, Any]) -> list[tuple[float, float]]:
    """(units, eval loss) of the first seed's plain frontier: the points every verdict reads."""
    plain = data.get("plain") or {}
    best = plain.get("best_lr_multiplier") or {}
    first = (plain.get("seeds") or [0])[0]
    separate = plain.get("mode") == "separate"
    out = []
    for budget in BUDGETS:
        rate = best.get(str(budget))
        for r in data["runs"]:
            if (
                r["method"] == "plain"
                and r["seed"] == first
                and r["lr_multiplier"] == rate
                and r["budget"] == budget
                and r["point"]
                and r.get("eval_loss") is not None
                and (r["kind"] == "separate") == separate
            ):
                out.append((r["units"], r["eval_loss"]))
                break
    return out


def plot(data: Mapping[str, Any], path: Path) -> Path:
    """Left: each method's speed-up against 1.0x with its band. Right: one panel per method, titled with
    its name: eval loss against compute, plain's frontier drawn as the envelope the verdicts read."""
    rows = [v for v in data.get("verdicts", []) if v["method"] != "plain"]
    if not rows:
        return _plot_so_far(data, path)
    points = frontier_points(data)
    panels = max(1, len(rows))
    grid_rows = max(2, -(-panels // 3))
    figure = Figure(figsize=(16, max(5.0, 0.45 * len(rows) + 2.0, 2.4 * grid_rows)), dpi=100)
    FigureCanvasAgg(figure)
    grid = figure.add_gridspec(grid_rows, 5)
    _forest(figure.add_subplot(grid[:, :2]), rows)
    for index, row in enumerate(rows):
        _method_panel(figure.add_subplot(grid[index // 3, 2 + index % 3]), row, points)
    return _save(figure, f"{data['task'].get('name')}: speed-up at equal eval loss against plain", path)


def _save(figure: Figure, title: str, path: Path) -> Path:
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, format="png")
    return path


def _plot_so_far(data: Mapping[str, Any], path: Path) -> Path:
    """A record without verdicts: the first seed's evaluated points so far, a line per method and rate
    (plain's race among them), so a run still going can be read."""
    first = (data.get("protocol", {}).get("seeds") or [0])[0]
    lines: dict[tuple[str, float], list[tuple[float, float]]] = {}
    for r in data["runs"]:
        if r["seed"] == first and r.get("point") and r.get("eval_loss") is not None:
            lines.setdefault((r["method"], r["lr_multiplier"]), []).append((r["units"], r["eval_loss"]))
    figure = Figure(figsize=(9, 6), dpi=100)
    FigureCanvasAgg(figure)
    axis = figure.add_subplot()
    for (method, rate), points in sorted(lines.items()):
        style = "-o" if method == "plain" else "--s"
        axis.plot(
            *zip(*sorted(points), strict=True),
            style,
            ms=4,
            label=f"{short_label({'method': method})} x{rate:g}",
        )
    axis.set_xlabel("compute (forward units)")
    axis.set_ylabel("eval loss")
    if lines:
        axis.legend(fontsize=7)
    title = f"{data['task'].get('name')}: no verdict yet, the points so far (the same command resumes it)"
    return _save(figure, title, path)


def _forest(axis: Any, rows: Sequence[Mapping[str, Any]]) -> None:
    """Each verdict's speed-up and its band on a log axis wide enough for every band, so none is cut."""
    colours = {"wins": "C2", "loses": "C3", "ties": "C0"}
    axis.set_xscale("log")
    axis.axvline(1.0, color="0.4", lw=1)
    shown = [1.0]
    for index, row in enumerate(rows):
        key = "speedup_time" if row.get("same_trajectory") else "speedup_units"
        y = len(rows) - index
        band = row.get("band") or {}
        if band.get("low") and band.get("high") and math.isfinite(band["high"]):
            axis.plot([band["low"], band["high"]], [y, y], color="0.8", lw=6, solid_capstyle="butt")
            shown += [band["low"], band["high"]]
        value = row.get(key)
        if not value:  # diverged, or its timing not complete
            continue
        shown.append(value)
        axis.plot(
            [value], [y], "D" if row.get("same_trajectory") else "o", color=colours.get(row["verdict"], "C7")
        )
        label = f"{speedup_text(row, key)} {row['verdict']}"
        axis.annotate(label, (value, y), xytext=(6, 4), textcoords="offset points", fontsize=8)
    axis.set_yticks(range(len(rows), 0, -1), [short_label(r) for r in rows], fontsize=8)
    axis.set_xlabel("speed-up (x plain, log scale; grey: the band a verdict must leave; ◆: judged in time)")
    axis.set_xlim(min(shown) / 1.3, max(shown) * 1.6)


def _method_panel(axis: Any, row: Mapping[str, Any], points: Sequence[tuple[float, float]]) -> None:
    """Plain's points (grey), the envelope the verdicts read (black: flat where a larger budget did no
    better, so a point above it is not plain's frontier) and the method's curve."""
    losses = [loss for _, loss in points]
    if points:
        frontier = envelope(points)
        frontier = [*frontier, (max(c for c, _ in points), frontier[-1][1])]
        axis.plot(*zip(*points, strict=True), "o", color="0.6", ms=3, label="plain's points")
        axis.plot(*zip(*frontier, strict=True), "-", color="k", lw=1.5, label="plain frontier")
    curve = [
        (c["units"], c["eval_loss"])
        for c in row.get("curve") or []
        if c.get("eval_loss") is not None and math.isfinite(c["eval_loss"])
    ]
    if curve:
        label = "method (its short run)" if row.get("same_trajectory") else "method"
        axis.plot(*zip(*curve, strict=True), "--s", ms=3, label=label)
    axis.set_title(short_label(row, 40), fontsize=9)
    axis.tick_params(labelsize=7)
    axis.set_xlabel("compute (forward units)", fontsize=7)
    axis.set_ylabel("eval loss", fontsize=7)
    if losses:
        span = max(losses) - min(losses) or 0.1
        shown = [*losses, *(loss for _, loss in curve if loss <= max(losses) + 2 * span)]
        pad = 0.15 * (max(shown) - min(shown) or 0.1)
        axis.set_ylim(min(shown) - pad, max(shown) + pad)
    axis.legend(fontsize=6)
