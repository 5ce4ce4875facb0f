"""Replay the spike guard's detector on recorded loss traces: which settings fire on clean runs, which
catch the faults.

Each trace is one plain `Trainer` run of a bench task (clean, or with a fault of `hf-hybrid bench
--faults` injected at the middle), its loss recorded at every optimizer step. The detector then reads
the trace step by step as the guard would (a step that fires is kept out of its window, as a skipped
batch is); for a faulted trace the first firing and how many of the fault's steps fired (`+k, m/n`) are
what it reads: a guarded run that restored would have a different trace after. Traces are kept in
the JSON, so new settings replay for free (`--replay_only`):

    python benchmarks/experiments/spike_replay.py --out benchmarks/experiments/results/spike_replay.json
"""

from __future__ import annotations

import argparse
import json
import types
from pathlib import Path
from typing import Any

import torch
from transformers import Trainer, TrainerCallback

from hf_hybrid.bench.faults import FAULTS, Faulted, fault_window
from hf_hybrid.bench.methods import parse_method
from hf_hybrid.bench.runner import run_trial
from hf_hybrid.bench.tasks import get_task
from hf_hybrid.engine.spike_guard import SpikeDetector, SpikeGuardConfig

# (task, size, seeds of the clean traces, seeds of the faulted ones), at the task's default rate
TRACES = (
    ("minilm_lora", "full", (0, 1), (0,)),
    ("clm_stdlib", "quick", (0, 1, 2), (0,)),
    ("minilm_cls", "full", (0,), ()),  # a full fine-tune: is it quiet when clean?
)
# The verdict table's clean runs: the five arena tasks at full size, 3 seeds, at the rate the arena tuned
# (`plain.best_lr_multiplier` of the committed record) and at twice it, the edge of stability.
ARENA_TASKS = ("minilm_lora", "minilm_cls", "decoder_lora", "decoder_ft", "clm_stdlib")
ARENA_SEEDS = (0, 1, 2)
ARENA_RECORDS = Path("benchmarks/results/arena")
ARENA_EVAL_POINTS = 4
SETTINGS = {  # name: SpikeGuardConfig fields
    "defaults (z 6, rise 0.5, 0.2 after a spike)": {},
    "rise 0.2 (the first rule)": {"min_rise": 0.2},
    "rise 0.5 always": {"min_rise_after_spike": 0.5},
    "z 8, rise 0.2": {"max_z": 8.0, "min_rise": 0.2},
    "z 10, rise 0.5": {"max_z": 10.0},
}


class LossTrace(TrainerCallback):
    """Records the loss `training_step` returns and the gradient norm, every step (gradient accumulation
    1 in the presets)."""

    def __init__(self) -> None:
        self.trainer: Trainer | None = None
        self.losses: list[float] = []
        self.grad_norms: list[float | None] = []

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        trainer = self.trainer
        original, original_norm = trainer.training_step, trainer._get_grad_norm

        def training_step(trainer: Trainer, model: Any, inputs: Any, num_items: Any = None) -> torch.Tensor:
            loss = original(model, inputs, num_items)
            self.losses.append(float(loss.detach()))
            return loss

        def get_grad_norm(trainer: Trainer, model: Any, grad_norm: Any = None) -> Any:
            grad_norm = original_norm(model, grad_norm=grad_norm)
            self.grad_norms.append(None if grad_norm is None else float(grad_norm))
            return grad_norm

        trainer.training_step = types.MethodType(training_step, trainer)
        trainer._get_grad_norm = types.MethodType(get_grad_norm, trainer)


def tuned_multiplier(task_name: str) -> float:
    """The rate multiplier the arena's committed record tuned for the task (`plain.best_lr_multiplier`)."""
    record = json.loads((ARENA_RECORDS / task_name / "results.json").read_text())
    return float(record["plain"]["best_lr_multiplier"])


def record(task_name: str, size: str, fault: str, seed: int, lr_multiplier: float = 1.0) -> dict[str, Any]:
    """One plain run's trace. The arena's runs evaluate 4 times (evaluation moves the random state, so
    the trajectory depends on it): those traces do too, and end at the arena record's eval loss."""
    task = get_task(task_name).bench_task(size)
    method = parse_method("plain")
    runner = method if fault == "clean" else Faulted(method, fault)
    trace = LossTrace()
    result = run_trial(
        task, runner, learning_rate=task.learning_rate * lr_multiplier, seed=seed, steps=task.max_steps,
        eval_points=1 if lr_multiplier == 1.0 else ARENA_EVAL_POINTS, callbacks=[trace],
    )  # fmt: skip
    start = None if fault == "clean" else fault_window(fault, task.max_steps).start
    return {
        "task": task_name, "size": size, "fault": fault, "seed": seed, "fault_start": start,
        "lr_multiplier": lr_multiplier, "learning_rate": task.learning_rate * lr_multiplier,
        "eval_loss": result.eval_loss, "losses": trace.losses, "grad_norms": trace.grad_norms,
    }  # fmt: skip


def wanted_traces() -> list[tuple[str, str, str, int, float]]:
    """(task, size, fault, seed, rate multiplier) of every trace the replay reads, in recording order."""
    wanted = [
        (task, size, fault, seed, 1.0)
        for task, size, clean_seeds, fault_seeds in TRACES
        for fault, seed in [("clean", s) for s in clean_seeds] + [(f, s) for f in FAULTS for s in fault_seeds]
    ]
    for task in ARENA_TASKS:
        tuned = tuned_multiplier(task)
        wanted += [(task, "full", "clean", seed, m) for m in (tuned, 2 * tuned) for seed in ARENA_SEEDS]
    return wanted


def trace_key(trace: dict[str, Any]) -> tuple[str, str, str, int, float]:
    return trace["task"], trace["size"], trace["fault"], trace["seed"], trace.get("lr_multiplier", 1.0)


def replay(losses: list[float], fields: dict[str, Any]) -> list[int]:
    """The 0-based steps at which the detector fires (a firing step stays out of its window, and the
    next step is judged as one after a spike, as the guard does after a skipped batch)."""
    detector = SpikeDetector(SpikeGuardConfig(**fields))
    fired: list[int] = []
    for step, loss in enumerate(losses):
        if detector.spike(loss, None, after_spike=bool(fired) and fired[-1] == step - 1) is not None:
            fired.append(step)
            continue
        detector.add(loss, None)
    return fired


def summary(traces: list[dict[str, Any]]) -> str:
    lines = [
        "| setting | " + " | ".join(f"{t['task']} {t['fault']} s{t['seed']}" for t in traces) + " |",
        "|---|" + "---|" * len(traces),
    ]
    for name, fields in SETTINGS.items():
        cells = []
        for trace in traces:
            fired = replay(trace["losses"], fields)
            if trace["fault"] == "clean":
                cells.append(f"{len(fired)} false" if fired else "0")
            else:
                window = fault_window(trace["fault"], len(trace["losses"]))
                after = [s - window.start for s in fired if s >= window.start]
                before = [s for s in fired if s < window.start]
                inside = sum(window.covers(s) for s in fired)
                seen = f"+{after[0]}, {inside}/{window.steps}" if after else "missed"
                cells.append(seen + (f" ({len(before)} false before)" if before else ""))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="benchmarks/experiments/results/spike_replay.json")
    parser.add_argument("--replay_only", action="store_true", help="replay the recorded traces, train none")
    args = parser.parse_args()
    torch.set_num_threads(1)
    out = Path(args.out)
    traces = json.loads(out.read_text()) if out.is_file() else []
    done = {trace_key(t) for t in traces}
    if not args.replay_only:
        for task_name, size, fault, seed, multiplier in wanted_traces():
            if (task_name, size, fault, seed, multiplier) in done:
                continue
            traces.append(record(task_name, size, fault, seed, multiplier))
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(traces) + "\n")
            print(
                f"{task_name} x{multiplier:g} {fault} seed {seed}: {len(traces[-1]['losses'])} steps, "
                f"eval loss {traces[-1]['eval_loss']:.4f}",
                flush=True,
            )
    table = summary(traces)
    out.with_suffix(".md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
