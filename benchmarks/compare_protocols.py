"""The first arena protocol against the second, task by task: every verdict and speed-up, and what each
record cost.

A record's cost is the compute of every run it holds (a run's own units: a branch's without the trunk it
left, a reused run's none) over the compute of one plain full-budget run of the task. The first
protocol's records are read from the commit that last held them.

    python benchmarks/compare_protocols.py            # prints the tables (markdown)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from table import FAMILIES, TASK_ORDER, pick, ratio  # noqa: E402

OLD_COMMIT = "5e685d4"
NEW = ROOT / "benchmarks" / "results" / "arena"


def old_record(task: str) -> dict:
    text = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{OLD_COMMIT}:benchmarks/results/arena/{task}/results.json"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(text)


def old_cost(record: dict) -> float:
    """Every run of the first protocol was a complete run from step 0: its units are its own."""
    full = [r["units"] for r in record["runs"] if r["method"] == "plain" and r["budget"] == 1.0]
    return sum(r["units"] for r in record["runs"]) / (sum(full) / len(full))


PARTS = ("plain", "schedule check", "same methods", "new methods")


def part(row: dict, old_methods: set[str]) -> str:
    """What a run of the second protocol was for: plain's sweep and frontier, the check of plain's
    schedule (plain's separate runs), a method the first protocol also ran, or one new to the second."""
    if row["method"] == "plain":
        return "schedule check" if row["kind"] == "separate" else "plain"
    return "same methods" if row["method"] in old_methods else "new methods"


def new_cost(record: dict, old_methods: set[str] | None = None) -> dict[str, float]:
    """Own units of every run (cumulative units minus the units of the run it continued), over a plain
    full run's, in total and by `part` when the first protocol's methods are given."""
    runs = record["runs"]
    ends = {(r["spec"].get("trunk_dir"), r["stop"]): r for r in runs if r["kind"] == "segment"}
    full = [r["units"] for r in runs if r["method"] == "plain" and r["budget"] == 1.0 and r["point"]]
    plain_run = sum(full) / len(full)
    parts: dict[str, float] = {"total": 0.0}
    for r in runs:
        if r.get("reused_from") or r.get("error"):
            continue
        before = ends.get((r["spec"].get("trunk_dir"), r["start"])) if r["start"] else None
        own = (r["units"] - (before["units"] if before else 0.0)) / plain_run
        parts["total"] += own
        if old_methods is not None:
            name = part(r, old_methods)
            parts[name] = parts.get(name, 0.0) + own
    return parts


def cell(row: dict | None) -> str:
    if row is None:
        return "–"
    if row["verdict"] == "baseline":
        return "1.00x"
    name = row["method"] if row["method"].split(":")[0] in ("freeze", "dropbp") else ""
    stopped = f" (stopped at {row['stopped_at']:g})" if row.get("stopped_at") else ""
    return f"{name + ' ' if name else ''}{ratio(row, 'speedup_units')} {row['verdict']}{stopped}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new", type=Path, default=NEW, help="the second protocol's records")
    new_dir = parser.parse_args().new
    records = {}
    for task in TASK_ORDER:
        path = new_dir / task / "results.json"
        new = json.loads(path.read_text()) if path.is_file() else {}
        if new.get("schema_version") == 2 and new.get("verdicts"):  # judged: its first command finished
            records[task] = (old_record(task), new)
    tasks = list(records)
    print("| method | " + " | ".join(f"`{t}` first → second" for t in tasks) + " |")
    print("|---|" + "---|" * len(tasks))
    for name, label in FAMILIES[1:]:
        cells = [f"{cell(pick(old, name))} → {cell(pick(new, name))}" for old, new in records.values()]
        print(f"| {label} | " + " | ".join(cells) + " |")
    print()
    print(
        "| task | first protocol, plain full runs | second | second / first | second: plain's sweep and "
        "frontier | schedule check | the first's methods | new methods | second without the new methods "
        "/ first | seed band first → second |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for task, (old, new) in records.items():
        a = old_cost(old)
        parts = new_cost(new, {r["method"] for r in old["runs"]})
        b = parts["total"]
        like = b - parts.get("new methods", 0.0)
        band_old, band_new = old["plain"].get("seed_band"), (new.get("plain") or {}).get("seed_band")
        bands = f"±{band_old:.2f} → " + (f"±{band_new:.2f}" if band_new is not None else "–")
        shares = " | ".join(f"{parts.get(name, 0.0):.1f}" for name in PARTS)
        print(f"| `{task}` | {a:.1f} | {b:.1f} | {b / a:.2f} | {shares} | {like / a:.2f} | {bands} |")


if __name__ == "__main__":
    main()
