"""`--workers 2` against `--workers 1`: the same arena, its wall time, and every run's eval loss.

Runs `hf-hybrid bench --suite quick --tasks clm_stdlib` (methods `plain hybrid null`) twice from empty
records, once with one worker process and once with two (one torch thread each, each pinned to its own
core), starting the second from the first's calibration so that both price steps alike; each is timed
from the moment its runs start (the calibration, which only the first does, is not in either). Prints a
table and writes JSON:

    python benchmarks/workers.py --out benchmarks/results/workers
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

COMMAND = ["bench", "--suite", "quick", "--tasks", "clm_stdlib", "--methods", "plain", "hybrid", "null"]


def arena(out: Path, workers: int) -> float:
    """Wall seconds of one arena's runs into `out` (whatever `out` holds is resumed), from the line that
    says they start (after the calibration, which only the first arena does) to the end."""
    command = [sys.executable, "-m", "hf_hybrid.cli", *COMMAND, "--workers", str(workers), "--out", str(out)]
    # each line as it is printed (the clock starts on one); one torch thread per run for both arenas
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    began = None
    for line in process.stdout:
        sys.stdout.write(line)
        if began is None and line.startswith("running on "):
            began = time.perf_counter()
    if process.wait() != 0 or began is None:
        raise SystemExit(f"{' '.join(command)} failed (exit code {process.returncode})")
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/workers")
    args = parser.parse_args()
    out = Path(args.out)
    shutil.rmtree(out / "runs", ignore_errors=True)
    one, two = out / "runs" / "one", out / "runs" / "two"
    seconds_one = arena(one, 1)
    record_one = json.loads((one / "clm_stdlib" / "results.json").read_text())
    (two / "clm_stdlib").mkdir(parents=True)
    empty = {
        **record_one,
        "runs": [],
        "decisions": {},
        "plain": {},
        "verdicts": [],
        "unused": [],
        "notes": [],
    }
    (two / "clm_stdlib" / "results.json").write_text(json.dumps(empty))
    seconds_two = arena(two, 2)
    record_two = json.loads((two / "clm_stdlib" / "results.json").read_text())
    losses_one = {r["key"]: r["eval_loss"] for r in record_one["runs"]}
    losses_two = {r["key"]: r["eval_loss"] for r in record_two["runs"]}
    result = {
        "command": "hf-hybrid " + " ".join(COMMAND),
        "runs": len(losses_one),
        "wall_seconds_workers_1": seconds_one,
        "wall_seconds_workers_2": seconds_two,
        "ratio": seconds_two / seconds_one,
        "same_runs": sorted(losses_one) == sorted(losses_two),
        "same_eval_loss_every_run": losses_one == losses_two,
        "machine": record_one["machine"],
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "workers.json").write_text(json.dumps(result, indent=1) + "\n")
    shutil.rmtree(out / "runs", ignore_errors=True)
    print("| workers | wall seconds | runs | eval losses equal |\n|---|---|---|---|")
    print(f"| 1 | {seconds_one:.0f} | {result['runs']} | |")
    equal = losses_one == losses_two
    print(f"| 2 | {seconds_two:.0f} ({result['ratio']:.2f}x of one) | {len(losses_two)} | {equal} |")


if __name__ == "__main__":
    main()
