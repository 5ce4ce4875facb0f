"""The default configuration's overhead over the plain Trainer, by alternating runs of one task.

    python benchmarks/experiments/overhead.py --task minilm_cls --size full --lr-multiplier 2 --repeats 2 \
        --out benchmarks/experiments/results/overhead_minilm_cls.json

Runs plain, hybrid, plain, hybrid, ... (same model, data, seed, arguments) in one process and reports
each run's time (CPU time on CPU, see `hf_hybrid.bench.runner`) and the ratio of the medians. With the
default configuration the hybrid run predicts nothing, so the ratio is the engine's bookkeeping cost.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch

from hf_hybrid.bench.runner import RunSpec, run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--task", default="clm_stdlib")
    parser.add_argument("--size", default="quick")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr-multiplier", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", required=True)
    opts = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    times: dict[str, list[float]] = {"plain": [], "hybrid": []}
    walls: dict[str, list[float]] = {"plain": [], "hybrid": []}
    losses: dict[str, list[float]] = {"plain": [], "hybrid": []}
    for _ in range(opts.repeats):
        for kind in ("plain", "hybrid"):
            result = run(RunSpec(opts.task, opts.size, kind, opts.seed, opts.lr_multiplier))
            times[kind].append(result.train_seconds)
            walls[kind].append(result.wall_seconds)
            losses[kind].append(result.eval_loss)
            print(f"{kind:6s} {result.clock} {result.train_seconds:7.1f}s wall {result.wall_seconds:7.1f}s "
                  f"eval loss {result.eval_loss:.4f}", flush=True)  # fmt: skip
    ratio = statistics.median(times["hybrid"]) / statistics.median(times["plain"])
    print(f"hybrid / plain (median time): {ratio:.3f}")
    Path(opts.out).parent.mkdir(parents=True, exist_ok=True)
    Path(opts.out).write_text(json.dumps({
        "command": " ".join(sys.argv), "task": opts.task, "size": opts.size, "seed": opts.seed,
        "lr_multiplier": opts.lr_multiplier, "clock": result.clock, "seconds": times, "wall_seconds": walls,
        "eval_loss": losses, "hybrid_over_plain": ratio,
    }, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
