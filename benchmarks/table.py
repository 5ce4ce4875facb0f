"""The README's verdict table, generated from the arena's records (never written by hand).

    python benchmarks/table.py            # print the table and rewrite it in README.md
    python benchmarks/table.py --check    # exit 1 if README.md's table is not what the records say

Reads the current judge's records (schema 3), `benchmarks/results/arena/<task>/results.json` (or
`<task>/<task>/results.json`, where `--tasks` put it), one `hf-hybrid bench` invocation per task, the
command in each record. Each verdict that differs from the previous table's records
(`benchmarks/results/arena_v3/`, the same protocol before its timing, noise and eval sets were made sound)
is named. One row per method
family; a family with several members listed (`freeze:k`, `packing`, `packing:rows`) shows the member with
the best verdict (wins, ties, unresolved, untuned, loses; time verdicts included), then the best speed-up.
A method *wins everywhere* when it wins on every task with each speed-up >= 1.0x and a median >= 1.2x.
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
PREVIOUS = ROOT / "benchmarks" / "results" / "arena_v3"  # the previous table's records
README = ROOT / "README.md"
START, END = "<!-- arena-table:start -->", "<!-- arena-table:end -->"
TASK_ORDER = ("clm_stdlib", "minilm_cls", "minilm_lora", "decoder_ft", "decoder_lora", "instruct_docstrings")
SCHEMA = 3
MARKS = {"lower_bound": ">", "upper_bound": "<"}
FAMILIES = (
    ("plain", "plain `Trainer`, lr raced (the judge)"),
    ("hybrid", "`hybrid` (library defaults: padding removed where it pays, the spike guard)"),
    ("hybrid-predict", "`hybrid-predict` (forced to predict)"),
    ("null-hybrid", "its null control (same phases, nothing applied)"),
    ("freeze", "`freeze:k` (the best k listed)"),
    ("selective-backprop", "`selective-backprop`"),
    ("selective-backprop:rule=uniform", "its null control (uniform draw)"),
    ("dropbp", "`dropbp:p` (the best p listed)"),
    ("args:optim=schedule_free_adamw", "schedule-free AdamW (no decay: each budget its trunk's point)"),
    ("peft", "LoRA instead of the full fine-tune (`peft:lora`)"),
    ("packing", "`packing` (padding removed: `packing` one row a batch, `packing:rows` bin-packed rows)"),
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


VERDICT_ORDER = ("wins", "ties", "unresolved", "untuned", "loses")


def speedup(row: dict) -> float:
    """What a verdict is read on: time for a same-trajectory method, compute units otherwise."""
    value = row.get("speedup_time") if row.get("same_trajectory") else row.get("speedup_units")
    return value or 0.0


def pick(record: dict, name: str) -> dict | None:
    """The family's verdict row: for a null control, the one of `hybrid-predict` when there are two; of
    several members, the one with the best verdict, then the best speed-up (a same-trajectory member's
    1.0x in units would otherwise hide its win in time)."""
    rows = [v for v in record["verdicts"] if family(v["method"]) == name]
    if name == "null-hybrid":
        preferred = [v for v in rows if (v.get("null_control_of") or "").startswith("hybrid-predict")]
        rows = preferred or rows
    if not rows:
        return None

    def rank(row: dict) -> tuple[int, float]:
        word = row["verdict"]
        return (-VERDICT_ORDER.index(word) if word in VERDICT_ORDER else -len(VERDICT_ORDER), speedup(row))

    return max(rows, key=rank)


def units_text(row: dict) -> str:
    """`>` a lower bound (below every plain point's eval loss), `<` an upper bound."""
    return MARKS.get(row.get("speedup_units_kind") or "", "") + f"{row['speedup_units']:.2f}x"


def time_text(row: dict) -> str:
    return "time not side by side" if row.get("speedup_time") is None else f"{row['speedup_time']:.2f}x"


def band_text(row: dict) -> str:
    band = row.get("band") or {}
    if band.get("low") is None or band.get("high") is None or not math.isfinite(band["high"]):
        return "no band"
    return f"band {band['low']:.2f}–{band['high']:.2f}x"


def delta_text(row: dict) -> str:
    """The eval-loss difference, and where a win ends worse than plain, that it never reaches plain's."""
    text = f"{row['loss_delta']:+.3f}"
    return text + ", never plain's loss" if row.get("never_reaches_plain") else text


def cell(row: dict | None) -> str:
    if row is None:
        return "–"
    if row["verdict"] == "baseline":
        return "1.00x"
    named = family(row["method"]) not in UNNAMED and (family(row["method"]) != row["method"])
    name = f"`{row['method']}`: " if named or family(row["method"]) in ("packing",) else ""
    word = f"**{row['verdict']}**" + (", never engaged" if row.get("engaged") is False else "")
    if row.get("same_trajectory"):
        timing = row.get("timing") or {}
        pairs = f", {timing['pairs']} timed pairs" if timing.get("pairs") else ""
        return f"{name}same trajectory, {time_text(row)} in time ({band_text(row)}{pairs}), {word}"
    if row.get("stopped_at"):
        return (
            f"{name}{units_text(row)} at {row['stopped_at']:g} of the budget ({delta_text(row)} against "
            f"plain there; {band_text(row)}), {word} (stopped there)"
        )
    seeds = "" if len(row["seeds"]) > 1 else " (1 seed)"
    return f"{name}{units_text(row)} / {time_text(row)} ({delta_text(row)}; {band_text(row)}), {word}{seeds}"


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
            named = ", ".join(f"{_name(v)} {_win_text(v)}" for v in sorted(rows, key=lambda v: -speedup(v)))
            parts.append(f"on `{task}` {named}")
    if not parts:
        return "No method wins on any single task either."
    nulls = any(
        v["verdict"] == "wins" and v.get("null_control_of") for r in records.values() for v in r["verdicts"]
    )
    return (
        "Where a method does win (above its band; compute units / time, or time alone for a method that "
        "trains plain's trajectory): "
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


def _win_text(row: dict) -> str:
    if row.get("same_trajectory"):
        pairs = (row.get("timing") or {}).get("pairs")
        return f"{time_text(row)} in time ({band_text(row)}, {pairs} timed pairs, same trajectory)"
    seeds = len(row["seeds"])
    never = ", never reaching plain's" if row.get("never_reaches_plain") else ""
    return (
        f"{units_text(row)} / {time_text(row)} (eval loss {row['loss_delta']:+.3f} vs plain{never}, "
        f"{band_text(row)}, {seeds} seed{'s' if seeds > 1 else ''})"
    )


def resolution_line(task: str, record: dict) -> str:
    """A task's resolution (the smallest speed-up its judge tells from 1.0x) and what its verdicts cost."""
    plain = record.get("plain") or {}
    res = plain.get("resolution") or {}
    if not res:
        text = "no resolution yet"
    elif res["slope"] <= 0:
        text = "no resolution: plain's eval loss no longer falls where the verdicts read"
    else:
        clusters = f", {res['eval_clusters']} eval documents" if res.get("eval_clusters") else ""
        text = f"resolution {res['resolution']:.2f}x at {res['seeds']} seed(s){clusters}"
        if plain.get("read_at", 1.0) != 1.0:
            text += f", read at {plain['read_at']:g} of the budget (plain's loss rose after it)"
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
        "Speed-up at equal eval loss against the plain `Trainer`, every verdict read at one budget fixed "
        "from plain's runs ([the protocol](docs/bench.md#the-protocol)): plain and every method raced by "
        "the same rules, each method's eval loss paired seed by seed with plain's and read on plain's "
        "frontier as the cost plain needs to get there. Compute units / time (eval loss − plain's; the "
        "band a verdict must leave: a 95% t interval joining the plain seeds' spread, the eval set's "
        "documents, the budget grid, the price and the frontier's slope), verdict. A method that trains "
        "plain's trajectory is judged in time on interleaved timed pairs. `>` = a lower bound (below every "
        "plain point's eval loss), `<` an upper bound. Time is shown only where the method and plain ran "
        "in one invocation. Other seeds run only where they could change a verdict (else 1 seed); a "
        "method below twice its band at half the budget stops there.",
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
            "Verdicts changed from the previous table's (`benchmarks/results/arena_v3/`):",
            "",
            *changed,
        ]
    if previous:
        lines += ["", "The previous table's reports: `benchmarks/results/arena_v3/<task>/report.md`."]
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
