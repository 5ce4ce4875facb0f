"""How long and what shape the arena's cooldown branches should be, measured rather than assumed.

One constant-rate trunk per task (at the plain rate the first protocol tuned), and from it a branch per
(cooldown fraction, decay shape, budget): the branch of budget `b` leaves the trunk at
`steps(b) * (1 - fraction)` and decays to zero by `steps(b)`, exactly as the arena's branches do. Each is
set against the first protocol's complete run of that budget with the task's linear schedule, fully
decayed, at the same rate (read from its committed record). The arena's default is the setting whose
branches come closest to, or beat, those runs at every budget.

    python benchmarks/cooldown.py --task clm_stdlib --out benchmarks/results/cooldown
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from hf_hybrid.bench import quiet_libraries
from hf_hybrid.bench.budget import BUDGETS, Budgets
from hf_hybrid.bench.execute import run_spec
from hf_hybrid.bench.recipe import build_task, preset_recipe
from hf_hybrid.bench.spec import BRANCH, SEGMENT, RunSpec, schedule_json

FRACTIONS = (0.1, 0.2, 0.3)
SHAPES = ("1-sqrt", "linear")
OLD = Path(__file__).resolve().parent / "results" / "arena"


def old_linear_runs(task: str, commit_record: Path) -> tuple[float, dict[float, float]]:
    """The first protocol's plain rate multiplier and its complete linear runs' eval loss per budget."""
    data = json.loads(commit_record.read_text())
    best = data["plain"]["best_lr_multiplier"]
    losses = {
        r["budget"]: r["eval_loss"]
        for r in data["runs"]
        if r["method"] == "plain" and r["seed"] == 0 and r["lr_multiplier"] == best
    }
    return best, losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", required=True)
    parser.add_argument("--old_record", required=True, help="the first protocol's results.json for the task")
    parser.add_argument("--out", default="benchmarks/results/cooldown")
    args = parser.parse_args()
    quiet_libraries()
    task = build_task(preset_recipe(args.task, "full"))
    multiplier, linear = old_linear_runs(args.task, Path(args.old_record))
    rate = task.learning_rate * multiplier
    steps = task.max_steps
    forks = sorted(
        {Budgets(steps, f, s).fork(b) for f in FRACTIONS for s in SHAPES for b in BUDGETS} | {steps}
    )
    rows = []
    with tempfile.TemporaryDirectory() as trunk_dir:
        constant = schedule_json({"max_steps": steps, "lr_scheduler_type": "constant", "warmup_steps": 0})
        start = 0
        for stop in forks[:-1]:
            spec = RunSpec(
                "plain", 0, multiplier, rate, SEGMENT, 1.0, start, stop, constant, trunk_dir, False
            )
            run_spec(task, spec)
            start = stop
        for fraction in FRACTIONS:
            for shape in SHAPES:
                budgets = Budgets(steps, fraction, shape)
                for budget in BUDGETS:
                    spec = RunSpec(
                        "plain", 0, multiplier, rate, BRANCH, budget, budgets.fork(budget),
                        budgets.steps(budget), schedule_json(budgets.wsd(budget)), trunk_dir,
                    )  # fmt: skip
                    loss = run_spec(task, spec).eval_loss
                    rows.append(
                        {
                            "fraction": fraction,
                            "shape": shape,
                            "budget": budget,
                            "eval_loss": loss,
                            "linear_eval_loss": linear.get(budget),
                        }
                    )
                    print(
                        f"{fraction:g} {shape:7} {budget:g}: {loss:.4f} "
                        f"(linear {linear.get(budget, float('nan')):.4f})"
                    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.task}.json").write_text(
        json.dumps({"task": args.task, "lr_multiplier": multiplier, "rows": rows}, indent=1) + "\n"
    )


if __name__ == "__main__":
    main()
