"""The README's verdict table, generated from the arena's records (never written by hand).

    python benchmarks/table.py            # print the table and rewrite it in README.md
    python benchmarks/table.py --check    # exit 1 if README.md's table is not what the records say

Reads the current judge's records (schema 3), `benchmarks/results/arena/<task>/results.json` (or
`<task>/<task>/results.json`, where `--tasks` put it), one `hf-hybrid bench` invocation per task, the
command in each record. Each verdict that differs from the previous judge's (schema 2, read at each
method's best budget: `benchmarks/results/arena_v2/<task>/report.md`) is named. One row per method
family; a family with several members listed (`freeze:k`, `dropbp:p`) shows the member with the best
speed-up. A method *wins everywhere* when it wins on every task with each speed-up >= 1.0x and a
median >= 1.2x.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

from hf_hybrid.bench.report import recommendation, what_would_reach

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "arena"
PREVIOUS = ROOT / "benchmarks" / "results" / "arena_v2"  # the previous judge's records (schema 2)
README = ROOT / "README.md"
START, END = "<!-- arena-table:start -->", "<!-- arena-table:end -->"
TASK_ORDER = ("clm_stdlib", "minilm_cls", "minilm_lora", "decoder_ft", "decoder_lora", "instruct_docstrings")
SCHEMA = 3
MARKS = {"lower_bound": ">", "upper_bound": "<"}
FAMILIES = (
    ("plain", "plain `Trainer`, lr raced (the judge)"),
    ("hybrid", "`hybrid` (library defaults)"),
    ("hybrid-predict", "`hybrid-predict` (forced to predict)"),
    ("null-hybrid", "its null control (same phases, nothing applied)"),
    ("freeze", "`freeze:k` (the best k listed)"),
    ("selective-backprop", "`selective-backprop`"),
    ("selective-backprop:rule=uniform", "its null control (uniform draw)"),
    ("dropbp", "`dropbp:p` (the best p listed)"),
    ("args:optim=schedule_free_adamw", "schedule-free AdamW (no decay: each budget its trunk's point)"),
    ("peft", "LoRA instead of the full fine-tune (`peft:lora`)"),
    ("packing", "`packing` (no padding, one row per batch)"),
    ("packing-naive", "`packing-naive`"),
    ("group_by_length", "`group_by_length`"),
    ("args:torch_compile=true", "`torch.compile` (same trajectory: judged in time)"),
    ("args:optim=adamw_torch_fused", "fused AdamW (same trajectory: judged in time)"),
)
UNNAMED = ("hybrid", "hybrid-predict", "null-hybrid", "peft", "args:optim=schedule_free_adamw")


def family(method: str) -> str:
    if method.startswith("null-hybrid"):
        return "null-hybrid"
    if method.startswith("selective-backprop") and "rule=uniform" in method:
        return "selective-backprop:rule=uniform"
    if method.startswith("args:"):
        return method
    return method.split(":", 1)[0]


def load(results: Path = RESULTS) -> dict[str, dict]:
    """Each task's record under `results` (`<task>/results.json` or `<task>/<task>/results.json`), by the
    task it names, in the README's order."""
    records = {}
    for path in sorted({*results.glob("*/results.json"), *results.glob("*/*/results.json")}):
        data = json.loads(path.read_text())
        records[(data.get("task") or {}).get("name") or path.parent.name] = data
    return dict(
        sorted(records.items(), key=lambda kv: TASK_ORDER.index(kv[0]) if kv[0] in TASK_ORDER else 99)
    )


def table(records: dict[str, dict], previous: dict[str, dict] | None = None) -> str:
    """The table of `records`, naming what changed from `previous` (the previous judge's records)."""
    return current_table(records, previous or {})


def changes(records: dict[str, dict], previous: dict[str, dict]) -> list[str]:
    """Per task judged by both: each method whose verdict word differs from the previous judge's."""
    lines = []
    for task, record in records.items():
        before = {v["method"]: v["verdict"] for v in (previous.get(task) or {}).get("verdicts", [])}
        both = [v for v in record["verdicts"] if v["method"] != "plain" and v["method"] in before]
        changed = [
            f"`{v['method']}` {before[v['method']]} → {v['verdict']}"
            for v in both
            if before[v["method"]] != v["verdict"]
        ]
        if both:
            kept = len(both) - len(changed)
            lines.append(
                f"- `{task}`: {'; '.join(changed) or 'no verdict changed'} ({kept} of {len(both)} unchanged)"
            )
    return lines


# ---- the current judge (schema 3): every verdict at the full budget, against its band -------------------


def pick(record: dict, name: str) -> dict | None:
    """The family's verdict row: for a null control, the one of `hybrid-predict` when there are two; of
    several members, the one with the best speed-up."""
    rows = [v for v in record["verdicts"] if family(v["method"]) == name]
    if name == "null-hybrid":
        preferred = [v for v in rows if (v.get("null_control_of") or "").startswith("hybrid-predict")]
        rows = preferred or rows
    if not rows:
        return None
    return max(rows, key=lambda v: v["speedup_units"])


def units_text(row: dict) -> str:
    """`>` a lower bound (below every plain point's eval loss), `<` an upper bound."""
    return MARKS.get(row.get("speedup_units_kind") or "", "") + f"{row['speedup_units']:.2f}x"


def band_text(row: dict) -> str:
    band = row.get("band") or {}
    if "low" not in band or not math.isfinite(band["high"]):
        return "no band"
    return f"band {band['low']:.2f}–{band['high']:.2f}x"


def cell(row: dict | None) -> str:
    if row is None:
        return "–"
    if row["verdict"] == "baseline":
        return "1.00x"
    name = "" if family(row["method"]) in UNNAMED or row.get("same_trajectory") else f"`{row['method']}`: "
    word = f"**{row['verdict']}**" + (", never engaged" if row.get("engaged") is False else "")
    if row.get("same_trajectory"):
        return f"same trajectory, {row['speedup_time']:.2f}x in time ({band_text(row)}), {word}"
    if row.get("stopped_at"):
        return (
            f"{name}{units_text(row)} at {row['stopped_at']:g} of the budget ({row['loss_delta']:+.3f}; "
            f"{band_text(row)}), {word} (stopped there)"
        )
    seeds = "" if len(row["seeds"]) > 1 else " (1 seed)"
    return (
        f"{name}{units_text(row)} / {row['speedup_time']:.2f}x ({row['loss_delta']:+.3f}; {band_text(row)}), "
        f"{word}{seeds}"
    )


def _name(row: dict) -> str:
    parent = row.get("null_control_of")
    return f"the null control of `{parent}`" if parent else f"`{row['method']}`"


def wins_everywhere(records: dict[str, dict]) -> list[str]:
    """Families whose member wins on every task, each speed-up >= 1.0x, median >= 1.2x (units)."""
    out = []
    for name, _ in FAMILIES[1:]:
        rows = [pick(record, name) for record in records.values()]
        if rows and all(r is not None and r["verdict"] == "wins" for r in rows):
            values = [r["speedup_units"] for r in rows]
            if min(values) >= 1.0 and statistics.median(values) >= 1.2:
                out.append(name)
    return out


def wins_somewhere(records: dict[str, dict]) -> str:
    """Every method that wins on a task, per task: what a user of that kind of fine-tune can take."""
    parts = []
    for task, record in records.items():
        rows = [v for v in record["verdicts"] if v["verdict"] == "wins"]
        if rows:
            named = ", ".join(
                f"{_name(v)} {units_text(v)} / {v['speedup_time']:.2f}x "
                f"(eval loss {v['loss_delta']:+.3f} vs plain, {band_text(v)}, {len(v['seeds'])} seeds)"
                for v in sorted(rows, key=lambda v: -v["speedup_units"])
            )
            parts.append(f"on `{task}` {named}")
    if not parts:
        return "No method wins on any single task either."
    nulls = any(
        v["verdict"] == "wins" and v.get("null_control_of") for r in records.values() for v in r["verdicts"]
    )
    return (
        "Where a method does win (above its band at the full budget; compute units / time): "
        + "; ".join(parts)
        + "."
        + (
            " A null control that wins says the skipped steps pay by themselves: the predictor's own share "
            "is the difference between the two."
            if nulls
            else ""
        )
        + ("" if wins_everywhere(records) else " None wins on every task, so none is made the default.")
    )


def resolution_line(task: str, record: dict) -> str:
    """A task's resolution (the smallest speed-up its judge tells from 1.0x) and what its verdicts cost."""
    plain = record.get("plain") or {}
    res = plain.get("resolution") or {}
    if not res:
        text = "no resolution yet"
    elif res["slope"] <= 0:
        text = "no resolution: plain's eval loss no longer falls at the full budget"
    else:
        text = f"resolution {res['resolution']:.2f}x at {res['seeds']} seed(s)"
        if res["resolution"] > res.get("target", 1.15):
            text += f" ({res.get('target', 1.15):g}x would take {what_would_reach(res)})"
    methods = sum(
        v.get("cost_plain_runs") or 0.0
        for v in record["verdicts"]
        if v["method"] != "plain" and not v.get("null_control_of")
    )
    parts = plain.get("cost_plain_runs") or {}
    race = f" (its race {parts['race']:.2f})" if "race" in parts else ""
    cost = f"plain's part {parts.get('total', 0.0):.2f}{race}, the methods' {methods:.2f}"
    return f"- `{task}`: {text}; cost in plain full runs: {cost}"


def current_table(records: dict[str, dict], previous: dict[str, dict]) -> str:
    """The table of the judged records; a record still without verdicts is listed under it with its
    command and how many runs it holds; then what changed from the previous judge's verdicts."""
    running = {t: r for t, r in records.items() if not r["verdicts"]}
    records = {t: r for t, r in records.items() if r["verdicts"]}
    tasks = list(records)
    winners = wins_everywhere(records)
    missing = [t for t in TASK_ORDER if t not in records and t not in running]
    partial = [t for t in TASK_ORDER if t not in records]
    named = ", ".join(f"`{w}`" for w in winners)
    headline = (
        f"**Not known yet**: {len(records)} of {len(TASK_ORDER)} tasks judged by this judge so far"
        + (f" ({named} wins on each of them)" if winners else "")
        + "; nothing is made the default before every task is judged."
        if partial
        else f"**Yes, on every task measured**: {named}."
        if winners
        else "**Not so far.** No method wins against the lr-raced plain `Trainer` on every task measured, "
        "the hybrid trainer included, so nothing is made the default: the library's default trains exactly "
        "like the plain `Trainer` unless its measured confidence clears a high bar. Earlier measurements "
        "(nowcasting, adaptive freezing, one-step prediction): [docs/history.md](docs/history.md)."
    )
    lines = [
        headline,
        "",
        wins_somewhere(records),
        "",
        "Speed-up at equal eval loss against the plain `Trainer`, every verdict read at the full budget "
        "([the protocol](docs/bench.md#the-protocol)): plain and every method raced by the same rules, "
        "each method's eval loss paired seed by seed with plain's and read on plain's frontier as the cost "
        "plain needs to get there. Compute units / time (eval loss − plain's; the band a verdict must "
        "leave: 2 standard errors joining the plain seeds' spread, the eval set's documents, the budget "
        "grid and the price), verdict. `>` = a lower bound (below every plain point's eval loss), `<` an "
        "upper bound. Other seeds run only where they could change a verdict (else 1 seed); a method below "
        "twice its band at half the budget stops there.",
        "",
        "| method | " + " | ".join(f"`{t}`" for t in tasks) + " |",
        "|---|" + "---|" * len(tasks),
    ]
    for name, label in FAMILIES:
        cells = [pick(records[t], name) for t in tasks]
        if any(c is not None for c in cells):
            lines.append(f"| {label} | " + " | ".join(cell(c) for c in cells) + " |")
    lines += [
        "",
        f"**Wins on every task judged so far** ({len(records)} of {len(TASK_ORDER)}): {named}."
        if winners and partial
        else f"**Wins on every task**: {named}."
        if winners
        else "**No method wins on every task**: nothing here is made the default.",
        "",
        "Each task's resolution (the smallest speed-up its judge tells from 1.0x) and what its verdicts "
        "cost:",
        "",
    ]
    lines += [resolution_line(t, records[t]) for t in tasks]
    lines += ["", "Commands (one per task; each reruns and resumes from its record):", ""]
    lines += [f"- `{t}`: `{records[t]['command']}`" for t in tasks]
    if running:
        lines += ["", "Being run (not judged yet; the same command resumes from the record):", ""]
        lines += [f"- `{t}`: `{r['command']}` ({len(r['runs'])} runs so far)" for t, r in running.items()]
    if missing:
        lines += ["", f"Not rerun yet under this judge: {', '.join(f'`{t}`' for t in missing)}."]
    for task, record in records.items():
        if any(v["verdict"] == "wins" and not v.get("null_control_of") for v in record["verdicts"]):
            lines += ["", f"What to do next on `{task}` (its report's advice, with the code to paste):", ""]
            lines += recommendation(record)[2:-1]
    changed = changes(records, previous)
    if changed:
        lines += [
            "",
            "Verdicts changed from the previous judge's (`benchmarks/results/arena_v2/`):",
            "",
            *changed,
        ]
    if previous:
        lines += ["", "The previous judge's reports: `benchmarks/results/arena_v2/<task>/report.md`."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if README.md's table is stale")
    opts = parser.parse_args(argv)
    generated = table(load(), load(PREVIOUS))
    readme = README.read_text()
    head, _, rest = readme.partition(START)
    _, _, tail = rest.partition(END)
    current = rest.partition(END)[0].strip("\n")
    if opts.check:
        return 0 if current == generated else 1
    README.write_text(f"{head}{START}\n{generated}\n{END}{tail}")
    print(generated)
    return 0


if __name__ == "__main__":
    sys.exit(main())
