"""`--workers 2` against `--workers 1`: the same arena, its wall time, every run's eval loss, and why.

Runs `hf-hybrid bench --suite quick --tasks clm_stdlib` (methods `plain hybrid null`, `--seeds` as given)
twice from empty records, once with one worker process and once with two (one torch thread each, each
pinned to its own core), starting the second from the first's calibration so that both price steps alike;
each is timed from the moment its runs start (the calibration, which only the first does, is not in
either).

Then it replays the first arena's record on a simulated clock, through the real coordinator and planner:
each run takes its recorded seconds plus the process start-up (the one-worker arena's wall time not spent
inside its runs, per run), with no slowdown between neighbours. Two workers on that clock give the ratio
the protocol's own chain allows (runs that wait on other runs); the measured ratio over it is what two
runs side by side on this machine cost each other. Prints a table and writes JSON:

    python benchmarks/workers.py --out benchmarks/results/workers                 # workers.json
    python benchmarks/workers.py --seeds 0 1 2 --out benchmarks/results/workers   # workers_seeds_3.json
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

from hf_hybrid.bench import SUITES, parse_methods
from hf_hybrid.bench.arena import Arena
from hf_hybrid.bench.execute import Measured
from hf_hybrid.bench.executors import Finished
from hf_hybrid.bench.plan import Protocol
from hf_hybrid.bench.record import Record
from hf_hybrid.bench.spec import RunSpec
from hf_hybrid.bench.tasks import preset

TASK, METHODS = "clm_stdlib", ["plain", "hybrid", "null"]


def arena(out: Path, workers: int, seeds: list[int]) -> float:
    """Wall seconds of one arena's runs into `out` (whatever `out` holds is resumed), from the line that
    says they start (after the calibration, which only the first arena does) to the end."""
    command = [
        *[sys.executable, "-m", "hf_hybrid.cli", "bench", "--suite", "quick", "--tasks", TASK],
        *["--methods", *METHODS, "--seeds", *map(str, seeds), "--workers", str(workers), "--out", str(out)],
    ]
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


def emptied(record: dict[str, Any]) -> dict[str, Any]:
    """`record` without its runs and what was decided from them: its task, machine and calibration."""
    return {**record, "runs": [], "decisions": {}, "plain": {}, "verdicts": [], "unused": [], "notes": []}


class Replay:
    """An executor on a simulated clock: each spec answers with its recorded row and takes its recorded
    wall seconds plus `start_up`; `workers` at a time, none slowing another."""

    def __init__(self, rows: dict[str, dict[str, Any]], workers: int, start_up: float) -> None:
        self.rows, self.workers, self.start_up = rows, workers, start_up
        self.clock, self.running, self.order = 0.0, [], 0

    def submit(self, spec: RunSpec) -> str:
        self.order += 1
        finish = self.clock + self.rows[spec.key]["wall_seconds"] + self.start_up
        heapq.heappush(self.running, (finish, self.order, spec))
        return "replay"

    def wait(self) -> list[Finished]:
        self.clock, _, spec = heapq.heappop(self.running)
        if spec.saves:  # what its branch and its continuation look for
            os.makedirs(f"{spec.trunk_dir}/checkpoint-{spec.stop}", exist_ok=True)
        row = self.rows[spec.key]
        measured = Measured(**{f.name: row[f.name] for f in fields(Measured) if f.name in row})
        return [Finished(spec, "replay", measured)]

    def close(self) -> None:
        self.running.clear()


def replayed_seconds(record: dict[str, Any], workers: int, start_up: float, seeds: list[int]) -> float:
    """The simulated wall time of `record`'s arena on `workers` workers (the same decisions, no training)."""
    suite = SUITES["quick"]
    task = preset(TASK, suite["size"])
    protocol = Protocol(seeds=tuple(seeds), lr_multipliers=suite["lr_multipliers"], widen=suite["widen"])
    rows = {r["key"]: r for r in record["runs"]}
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "results.json").write_text(json.dumps(emptied(record)))
        opened = Record.open(folder, task.describe(), task.identity(), "replay")
        parsed, nulls = parse_methods(METHODS)
        replay = Replay(rows, workers, start_up)
        Arena(task, parsed, nulls, protocol, opened, executor=replay, echo=lambda line: None).run()
        replayed = json.loads(Path(folder, "results.json").read_text())
    if sorted(r["key"] for r in replayed["runs"]) != sorted(rows):
        raise SystemExit("the replay did not take the recorded arena's decisions")
    return replay.clock


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/workers")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    args = parser.parse_args()
    out = Path(args.out)
    shutil.rmtree(out / "runs", ignore_errors=True)
    one, two = out / "runs" / "one", out / "runs" / "two"
    seconds_one = arena(one, 1, args.seeds)
    record_one = json.loads((one / TASK / "results.json").read_text())
    (two / TASK).mkdir(parents=True)
    (two / TASK / "results.json").write_text(json.dumps(emptied(record_one)))
    seconds_two = arena(two, 2, args.seeds)
    record_two = json.loads((two / TASK / "results.json").read_text())
    losses_one = {r["key"]: r["eval_loss"] for r in record_one["runs"]}
    losses_two = {r["key"]: r["eval_loss"] for r in record_two["runs"]}
    trained = [r for r in record_one["runs"] if not r.get("reused_from")]
    start_up = (seconds_one - sum(r["wall_seconds"] for r in trained)) / len(trained)
    chain_one = replayed_seconds(record_one, 1, start_up, args.seeds)
    chain_two = replayed_seconds(record_one, 2, start_up, args.seeds)
    result = {
        "command": f"hf-hybrid bench --suite quick --tasks {TASK} --methods {' '.join(METHODS)} "
        f"--seeds {' '.join(map(str, args.seeds))}",
        "runs": len(losses_one),
        "runs_trained": len(trained),
        "wall_seconds_workers_1": seconds_one,
        "wall_seconds_workers_2": seconds_two,
        "ratio": seconds_two / seconds_one,
        "same_runs": sorted(losses_one) == sorted(losses_two),
        "same_eval_loss_every_run": losses_one == losses_two,
        "start_up_seconds_per_run": start_up,
        "replayed_seconds_workers_1": chain_one,
        "replayed_seconds_workers_2": chain_two,
        "replayed_ratio": chain_two / chain_one,
        "side_by_side_slowdown": (seconds_two / seconds_one) / (chain_two / chain_one),
        "machine": record_one["machine"],
    }
    out.mkdir(parents=True, exist_ok=True)
    name = "workers.json" if args.seeds == [0] else f"workers_seeds_{len(args.seeds)}.json"
    (out / name).write_text(json.dumps(result, indent=1) + "\n")
    shutil.rmtree(out / "runs", ignore_errors=True)
    print("| workers | wall seconds | replayed without neighbours | runs | eval losses equal |")
    print("|---|---|---|---|---|")
    print(f"| 1 | {seconds_one:.0f} | {chain_one:.0f} | {result['runs']} | |")
    equal = losses_one == losses_two
    print(
        f"| 2 | {seconds_two:.0f} ({result['ratio']:.2f}x of one) | {chain_two:.0f} "
        f"({result['replayed_ratio']:.2f}x) | {len(losses_two)} | {equal} |"
    )


if __name__ == "__main__":
    main()
