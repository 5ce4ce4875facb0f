"""The README's verdict table, generated from the arena's records (never written by hand).

    python benchmarks/table.py            # print the table and rewrite it in README.md
    python benchmarks/table.py --check    # exit 1 if README.md's table is not what the records say

Reads `benchmarks/results/arena/<task>/results.json` (one `hf-hybrid bench` invocation per task, the
command in each record). One row per method family; a family swept on the first seed (`freeze:k`,
`dropbp:p`) shows the member with the best speed-up there. A method *wins everywhere* when it wins on
every task with each speed-up >= 1.0x and a median >= 1.2x.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "arena"
README = ROOT / "README.md"
START, END = "<!-- arena-table:start -->", "<!-- arena-table:end -->"
TASK_ORDER = ("clm_stdlib", "minilm_cls", "minilm_lora", "decoder_ft", "decoder_lora")
FAMILIES = (
    ("plain", "plain `Trainer`, lr tuned (the judge)"),
    ("hybrid", "`hybrid` (library defaults)"),
    ("hybrid-predict", "`hybrid-predict` (forced to predict)"),
    ("null-hybrid", "its null control (same phases, nothing applied)"),
    ("freeze", "`freeze:k` (k swept on seed 0)"),
    ("selective-backprop", "`selective-backprop`"),
    ("selective-backprop:rule=uniform", "its null control (uniform draw)"),
    ("dropbp", "`dropbp:p` (p swept on seed 0)"),
    ("args:optim=schedule_free_adamw", "schedule-free AdamW (no decay: each budget its trunk's point)"),
    ("peft", "LoRA instead of the full fine-tune (`peft:lora`)"),
    ("args:torch_compile=true", "`torch.compile` (same trajectory: judged in time)"),
)


def family(method: str) -> str:
    if method.startswith("null-hybrid"):
        return "null-hybrid"
    if method.startswith("selective-backprop") and "rule=uniform" in method:
        return "selective-backprop:rule=uniform"
    if method.startswith("args:"):
        return method
    return method.split(":", 1)[0]


def load(results: Path = RESULTS) -> dict[str, dict]:
    records = {}
    for path in sorted(results.glob("*/results.json")):
        records[path.parent.name] = json.loads(path.read_text())
    return dict(
        sorted(records.items(), key=lambda kv: TASK_ORDER.index(kv[0]) if kv[0] in TASK_ORDER else 99)
    )


def pick(record: dict, name: str) -> dict | None:
    """The family's verdict row: for a null control, the one of `hybrid-predict` when there are two."""
    rows = [v for v in record["verdicts"] if family(v["method"]) == name]
    if name == "null-hybrid":
        preferred = [v for v in rows if (v.get("null_control_of") or "").startswith("hybrid-predict")]
        rows = preferred or rows
    if not rows:
        return None
    return max(rows, key=lambda v: v["per_seed"][0]["speedup_units"] if v.get("per_seed") else 1.0)


def ratio(row: dict, key: str) -> str:
    """`>` when every seed ended below the whole plain frontier (a lower bound), `<` above it."""
    kinds = {seed[f"{key}_kind"] for seed in row.get("per_seed") or []}
    mark = {frozenset({"lower_bound"}): ">", frozenset({"upper_bound"}): "<"}.get(frozenset(kinds), "")
    return f"{mark}{row[key]:.2f}x"


def cell(row: dict | None) -> str:
    if row is None:
        return "–"
    if row["verdict"] == "baseline":
        return "1.00x"
    name = (
        "" if family(row["method"]) in ("hybrid", "hybrid-predict", "null-hybrid") else f"`{row['method']}`: "
    )
    seeds = len(row["seeds"])
    if family(row["method"]) in ("peft", "args:optim=schedule_free_adamw", "args:torch_compile=true"):
        name = ""
    if row.get("stopped_at"):
        return (
            f"{name}{ratio(row, 'speedup_units')} at {row['stopped_at']:g} of the budget "
            f"({row['final_loss_delta']:+.3f}), **{row['verdict']}** (stopped there)"
        )
    units = "same trajectory" if row.get("same_trajectory") else ratio(row, "speedup_units") + _range(row)
    budget = row.get("budget", 1.0)
    at = f" at {budget:g}" if budget < 1.0 else ""
    return (
        f"{name}{units} / {_time(row)}{at} ({row['final_loss_delta']:+.3f}), "
        f"**{row['verdict']}**{'' if seeds > 1 else ' (1 seed)'}"
    )


def _range(row: dict) -> str:
    """The seeds' spread of the unit speed-up, where more than one seed ran."""
    values = [seed["speedup_units"] for seed in row.get("per_seed") or []]
    return f" ({min(values):.2f}–{max(values):.2f})" if len(values) > 1 else ""


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


def _name(row: dict) -> str:
    parent = row.get("null_control_of")
    return f"the null control of `{parent}`" if parent else f"`{row['method']}`"


def _time(row: dict) -> str:
    return ratio(row, "speedup_time") + ("~" if row.get("speedup_time_within_clock_noise") else "")


def wins_somewhere(records: dict[str, dict]) -> str:
    """Every method that wins on a task, per task: what a user of that kind of fine-tune can take."""
    parts = []
    for task, record in records.items():
        rows = [v for v in record["verdicts"] if v["verdict"] == "wins"]
        if rows:
            named = ", ".join(
                f"{_name(v)} {ratio(v, 'speedup_units')} / {_time(v)} "
                f"(eval loss {v['final_loss_delta']:+.3f} vs plain, {len(v['seeds'])} seeds)"
                for v in sorted(rows, key=lambda v: -v["speedup_units"])
            )
            parts.append(f"on `{task}` {named}")
    if not parts:
        return "No method wins on any single task either."
    nulls = any(
        v["verdict"] == "wins" and v.get("null_control_of") for r in records.values() for v in r["verdicts"]
    )
    return (
        "Where a method does win (every seed above 1 + the plain runs' seed band in compute units; units / "
        "time): "
        + "; ".join(parts)
        + "."
        + (
            " A null control that wins says the skipped steps pay by themselves: the predictor's own share "
            "is the difference between the two."
            if nulls
            else ""
        )
        + " None wins on every task, so none is made the default."
    )


def table(records: dict[str, dict]) -> str:
    """The table of the judged records; a record still without verdicts (its first command has not
    finished) is listed under it with its command and how many runs it holds."""
    running = {t: r for t, r in records.items() if not r["verdicts"]}
    records = {t: r for t, r in records.items() if r["verdicts"]}
    tasks = list(records)
    winners = wins_everywhere(records)
    missing = [t for t in TASK_ORDER if t not in records and t not in running]
    headline = (
        f"**Yes, on every task measured**: {', '.join(f'`{w}`' for w in winners)}."
        if winners
        else "**Not so far.** No method wins against the lr-tuned plain `Trainer` on every task measured, "
        "the hybrid trainer included, so nothing is made the default: the library's default trains exactly "
        "like the plain `Trainer` unless its measured confidence clears a high bar. Earlier measurements "
        "(nowcasting, adaptive freezing, one-step prediction): [docs/history.md](docs/history.md)."
    )
    lines = [
        headline,
        "",
        wins_somewhere(records),
        "",
        "Speed-up at equal eval loss against the plain `Trainer` tuned at every budget (one "
        "warmup-stable-decay trunk per rate, a cooldown branch at each smaller budget, the rates raced by "
        "successive halving, the frontier read at its best point so far): compute units / CPU time (eval "
        "loss − plain's at that budget), verdict, each method read at its own best budget (its lowest eval "
        "loss: `at 0.75` where that is not the full budget, on a task that overfits); `~` = within the "
        "clock noise; `>` = a lower bound (the run ended below every plain point's eval loss), `<` an "
        "upper bound. Median over the seeds run, with their range: 3 where more seeds could change the "
        "verdict (the first above 1 + the plain seed band, or between 1 − 2 bands and 1 − band), else 1. A "
        "method below 1 − 2 bands at half the budget stops there.",
        "",
        "| method | " + " | ".join(f"`{t}`" for t in tasks) + " |",
        "|---|" + "---|" * len(tasks),
    ]
    for name, label in FAMILIES:
        lines.append(f"| {label} | " + " | ".join(cell(pick(records[t], name)) for t in tasks) + " |")
    lines += [
        "",
        f"**Wins on every task**: {', '.join(f'`{w}`' for w in winners)}."
        if winners
        else "**No method wins on every task**: nothing here is made the default.",
        "",
        "Commands (one per task; each reruns and resumes from its record):",
        "",
    ]
    lines += [f"- `{t}`: `{records[t]['command']}`" for t in tasks]
    if running:
        lines += ["", "Being run (not judged yet; the same command resumes from the record):", ""]
        lines += [f"- `{t}`: `{r['command']}` ({len(r['runs'])} runs so far)" for t, r in running.items()]
    if missing:
        lines += ["", f"Still being run: {', '.join(f'`{t}`' for t in missing)} (same protocol)."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if README.md's table is stale")
    opts = parser.parse_args(argv)
    generated = table(load())
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
