"""Which of the spike guard's storages recovers a full fine-tune best from an lr burst, and at what cost.

Host copies (weights and Adam's moments) may not fit; the guard then keeps weights only or reads the last
checkpoint (that arm saves every `--save_steps`). Each arm trains with the fault bench's lr burst at mid-run:

    python benchmarks/guard_storage.py --task decoder_ft --seeds 0 \\
        --out benchmarks/results/guard_storage/guard_storage.json

`--checkpoint_sizes` instead measures what the hybrid trainer at its defaults adds to a checkpoint.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import torch
from transformers import Trainer
from transformers.trainer_utils import SaveStrategy

from hf_hybrid.bench.measure.faults import Faulted
from hf_hybrid.bench.methods import Method, TrialContext, parse_method
from hf_hybrid.bench.runner import run_trial
from hf_hybrid.bench.tasks import get_task

ARMS = {
    "plain": "plain",
    "host": "hybrid:spike_guard=on,guard_storage=host",
    "weights": "hybrid:spike_guard=on,guard_storage=weights",
    "checkpoint": "hybrid:spike_guard=on,guard_storage=checkpoint",
}


class Saving(Method):
    """Another method's run that saves a checkpoint every `every` steps (the two newest kept)."""

    def __init__(self, inner: Method, every: int) -> None:
        super().__init__(inner.spec, {})
        self.inner, self.every = inner, every

    def build(self, ctx: TrialContext) -> Trainer:
        trainer = self.inner.build(ctx)
        trainer.args.save_strategy, trainer.args.save_steps = SaveStrategy.STEPS, self.every
        trainer.args.save_total_limit = 2
        return trainer

    def step_counts(self, trainer: Trainer, steps: int) -> dict[str, int]:
        return self.inner.step_counts(trainer, steps)


def run_arm(task_name: str, size: str, arm: str, fault: str, seed: int, save_steps: int) -> dict[str, Any]:
    task = get_task(task_name).bench_task(size)
    method: Method = parse_method(ARMS[arm])
    if arm == "checkpoint":
        method = Saving(method, save_steps)
    if fault != "clean":
        method = Faulted(method, fault)
    result = run_trial(
        task, method, learning_rate=task.learning_rate, seed=seed, steps=task.max_steps, eval_points=1
    )
    stats = result.stats
    keys = {"restores": 0, "restore_steps": [], "skips": 0, "spike_guard_bytes": 0}
    return {
        "task": task_name,
        "size": size,
        "arm": arm,
        "fault": fault,
        "seed": seed,
        "eval_loss": result.eval_loss,
        "seconds": result.train_seconds,
        **{key: stats.get(key, default) for key, default in keys.items()},
        "storage": stats.get("spike_guard_storage"),
        "copy_every": stats.get("spike_guard_copy_every"),
        "spike_guard_time_share": stats.get("timing", {}).get("parts", {}).get("spike_guard"),
    }


def checkpoint_sizes(task_name: str, size: str, steps: int) -> dict[str, Any]:
    """Each file's bytes of plain's and the hybrid trainer's checkpoint after `steps`, and the share added."""
    task = get_task(task_name).bench_task(size)
    sizes = {}
    for arm in ("plain", "hybrid"):
        with tempfile.TemporaryDirectory() as out:
            method = Saving(parse_method(arm), steps)
            run_trial(task, method, learning_rate=task.learning_rate, seed=0, steps=steps, output_dir=out)
            folder = Path(out) / f"checkpoint-{steps}"
            sizes[arm] = {f.name: f.stat().st_size for f in folder.iterdir() if f.is_file()}
    plain, hybrid = (sum(sizes[arm].values()) for arm in ("plain", "hybrid"))
    return {"task": task_name, "size": size, "steps": steps, "files": sizes, "added": hybrid / plain - 1}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="decoder_ft")
    parser.add_argument("--size", default="full")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--save_steps", type=int, default=10)
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--out", default="benchmarks/results/guard_storage/guard_storage.json")
    parser.add_argument("--checkpoint_sizes", action="store_true", help="measure checkpoint sizes instead")
    parser.add_argument("--steps", type=int, default=20, help="--checkpoint_sizes: steps before the save")
    args = parser.parse_args()
    torch.set_num_threads(1)
    out = Path(args.out)
    if args.checkpoint_sizes:
        path = out.with_name("checkpoint_sizes.json")
        rows = json.loads(path.read_text()) if path.is_file() else []
        rows.append(checkpoint_sizes(args.task, args.size, args.steps))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(rows, indent=1) + "\n")
        print(json.dumps(rows[-1], indent=1))
        return
    rows = json.loads(out.read_text()) if out.is_file() else []
    done = {(r["task"], r["arm"], r["fault"], r["seed"]) for r in rows}
    wanted = [
        (arm, fault)
        for arm in args.arms
        for fault in (("clean", "lr_burst") if arm == "plain" else ("lr_burst",))
    ]
    for seed in args.seeds:
        for arm, fault in wanted:
            if (args.task, arm, fault, seed) in done:
                continue
            rows.append(run_arm(args.task, args.size, arm, fault, seed, args.save_steps))
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(rows, indent=1) + "\n")
            row = rows[-1]
            print(
                f"{args.task} seed {seed} {arm:<10} {fault:<8} eval loss {row['eval_loss']:.4f} "
                f"restores {row['restore_steps']} bytes {row['spike_guard_bytes']}",
                flush=True,
            )


if __name__ == "__main__":
    main()
