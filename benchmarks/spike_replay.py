"""Replay the spike guard's detector on recorded loss traces: which settings fire on clean runs, which
catch the faults.

Each trace is one plain `Trainer` run of a bench task (clean, or with a fault of `hf-hybrid bench
--faults` injected at the middle), its loss recorded at every optimizer step. The detector then reads
the trace step by step as the guard would (a step that fires is kept out of its window, as a skipped
batch is); for a faulted trace the first firing and how many of the fault's steps fired (`+k, m/n`) are
what it reads: a guarded run that restored would have a different trace after. Traces are kept in
the JSON, so new settings replay for free (`--replay_only`):

    python benchmarks/spike_replay.py --out benchmarks/results/spike_replay/spike_replay.json
"""

from __future__ import annotations

import argparse
import json
import types
from pathlib import Path
from typing import Any

import torch
from transformers import Trainer, TrainerCallback

from hf_hybrid.bench.measure.faults import FAULTS, Faulted, fault_window
from hf_hybrid.bench.methods import parse_method
from hf_hybrid.bench.runner import run_trial
from hf_hybrid.bench.tasks import get_task
from hf_hybrid.engine.spike_guard import DATA, WEIGHTS, SpikeDetector, SpikeGuard, SpikeGuardConfig
from hf_hybrid.engine.update_check import UpdateCheck

# (task, size, seeds of the clean traces, seeds of the faulted ones), at the task's default rate
TRACES = (
    ("minilm_lora", "full", (0, 1), (0,)),
    ("clm_stdlib", "quick", (0, 1, 2), (0,)),
    ("minilm_cls", "full", (0,), (0,)),  # a full fine-tune
    ("decoder_lora", "full", (), (0,)),  # an lr burst within the batch noise?
    ("decoder_ft", "full", (), (0,)),
)
# The verdict table's clean runs: the five arena tasks at full size, 3 seeds, at the full budget's rate the
# arena tuned (`decisions.best["1.0"]` of the committed record) and at twice it, the edge of stability.
ARENA_TASKS = ("minilm_lora", "minilm_cls", "decoder_lora", "decoder_ft", "clm_stdlib")
ARENA_SEEDS = (0, 1, 2)
ARENA_RECORDS = Path("benchmarks/results/arena")
ARENA_EVAL_POINTS = 4
SETTINGS = {  # name: SpikeGuardConfig fields
    "patience 1 (restore at once)": {"patience": 1},
    "patience 2 (the default)": {},
    "patience 4": {"patience": 4},
    "patience 6": {"patience": 6},
    "patience 2, rise 0.2": {"min_rise": 0.2},
}


class LossTrace(TrainerCallback):
    """Records the loss `training_step` returns, the gradient norm and the norm of the update the
    optimizer applied (all trainable tensors), every step (gradient accumulation 1 in the presets)."""

    def __init__(self) -> None:
        self.trainer: Trainer | None = None
        self.losses: list[float] = []
        self.grad_norms: list[float | None] = []
        self.update_norms: list[float] = []

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
        optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)  # accelerate's wrapper
        params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
        before: list[torch.Tensor] = []

        def copy_before(optimizer: Any, args: Any, kwargs: Any) -> None:
            before[:] = [p.detach().clone() for p in params]

        def measure_after(optimizer: Any, args: Any, kwargs: Any) -> None:
            deltas = torch._foreach_sub([p.detach() for p in params], before)
            self.update_norms.append(float(torch.stack(torch._foreach_norm(deltas)).norm()))

        optimizer.register_step_pre_hook(copy_before)
        optimizer.register_step_post_hook(measure_after)


def tuned_multiplier(task_name: str) -> float | None:
    """The full budget's best rate multiplier in the arena's committed record (its sweep's decision, there
    as soon as the sweep has ended, before the methods run), or None while the task has none."""
    path = ARENA_RECORDS / task_name / "results.json"
    if not path.is_file():
        return None
    best = json.loads(path.read_text()).get("decisions", {}).get("best", {}).get("1.0")
    return None if best is None else float(best)


def record(
    task_name: str, size: str, fault: str, seed: int, lr_multiplier: float = 1.0, eval_points: int = 1
) -> dict[str, Any]:
    """One plain run's trace. The verdict table's runs evaluate `ARENA_EVAL_POINTS` times, as the first
    protocol's arena did (evaluation moves the random state, so the trajectory depends on it)."""
    task = get_task(task_name).bench_task(size)
    method = parse_method("plain")
    runner = method if fault == "clean" else Faulted(method, fault)
    trace = LossTrace()
    result = run_trial(
        task, runner, learning_rate=task.learning_rate * lr_multiplier, seed=seed, steps=task.max_steps,
        eval_points=eval_points, callbacks=[trace],
    )  # fmt: skip
    start = None if fault == "clean" else fault_window(fault, task.max_steps).start
    return {
        "task": task_name, "size": size, "fault": fault, "seed": seed, "fault_start": start,
        "lr_multiplier": lr_multiplier, "learning_rate": task.learning_rate * lr_multiplier,
        "eval_loss": result.eval_loss, "losses": trace.losses, "grad_norms": trace.grad_norms,
        "update_norms": trace.update_norms,
    }  # fmt: skip


def wanted_traces() -> list[tuple[str, str, str, int, float, int]]:
    """(task, size, fault, seed, rate multiplier, evaluations) of every trace the replay reads, in
    recording order."""
    wanted = [
        (task, size, fault, seed, 1.0, 1)
        for task, size, clean_seeds, fault_seeds in TRACES
        for fault, seed in [("clean", s) for s in clean_seeds] + [(f, s) for f in FAULTS for s in fault_seeds]
    ]
    for task in ARENA_TASKS:
        tuned = tuned_multiplier(task)
        if tuned is not None:
            wanted += [
                (task, "full", "clean", seed, m, ARENA_EVAL_POINTS)
                for seed in ARENA_SEEDS
                for m in (tuned, 2 * tuned)
            ]
    return wanted


def trace_key(trace: dict[str, Any]) -> tuple[str, str, str, int, float]:
    return trace["task"], trace["size"], trace["fault"], trace["seed"], trace.get("lr_multiplier", 1.0)


def detector_fires(trace: dict[str, Any]) -> list[int]:
    """The 1-based steps at which the guard's detector fires when every step is applied (as a plain run
    applies them): a sudden spike, or a lasting shift whose own step is up too, as the guard judges."""
    detector = SpikeDetector(SpikeGuardConfig())
    fired: list[int] = []
    for step, (loss, grad_norm) in enumerate(_steps(trace), start=1):
        lasting = detector.lasting(loss)
        if lasting and not detector.elevated(loss):
            lasting = None
        after_spike = bool(fired) and fired[-1] == step - 1
        if lasting or detector.sudden(loss, grad_norm, after_spike):
            fired.append(step)
        detector.add(loss, grad_norm, step)
    return fired


def update_check_fires(trace: dict[str, Any]) -> tuple[list[int], float] | None:
    """The 1-based steps whose applied update the shipped `UpdateCheck` judges outsized (more than
    `max_update_ratio` times the median of the recent ones; whether it is then taken back depends on its
    batch measured at the weights before and after, which a trace has not), and the largest ratio of
    the updates it leaves; None for a trace recorded without the update norms."""
    if "update_norms" not in trace:
        return None
    config = SpikeGuardConfig()
    check = UpdateCheck(
        [], max_ratio=config.max_update_ratio, history=config.history, min_history=config.min_history,
        suspect_loss=None,
    )  # fmt: skip
    fired: list[int] = []
    largest = 0.0
    for step, norm in enumerate(trace["update_norms"], start=1):
        ratio = check._ratio(norm)
        if ratio > config.max_update_ratio:
            fired.append(step)  # a guarded run takes it back (if it raised its batch's loss) or learns it
        else:
            largest = max(largest, ratio)
        check.norms.append(norm)
    return fired, largest


def replay_guard(trace: dict[str, Any], fields: dict[str, Any], blamed: str) -> str:
    """The shipped `SpikeGuard` over a trace, step by step as the engine drives it, with its second
    measurement of the suspect batches standing for what it finds when `blamed` is to blame (`data`:
    the batches are as bad at the trusted weights; `weights`: they are at the recent level there).
    Returns the skips and the first restore (1-based steps); the trace after a restore is not what the
    guarded run would have seen, so the replay stops there."""
    param = torch.nn.Parameter(torch.zeros(1))
    guard: SpikeGuard
    measured: dict[str, float] = {}

    def suspect_loss() -> float:
        return measured["data"] if blamed == DATA else measured["weights"]

    config = SpikeGuardConfig(**{"max_copy_share": 0.0, **fields})  # copies every `every`: no clock
    guard = SpikeGuard(torch.optim.SGD([param], lr=0.1), config, suspect_loss=suspect_loss)
    skips: list[int] = []
    for step, (loss, grad_norm) in enumerate(_steps(trace), start=1):
        measured["data"] = loss
        if guard.suspect_since is None:  # the trusted weights' loss: the level before the suspicion
            measured["weights"] = guard.detector.level() if guard.detector.losses else loss
        alarms = guard.alarms(step, loss, grad_norm)
        if any(a.skips_step for a in alarms):
            guard.skipped(step)
            skips.append(step)
            continue
        if any(a.restorable for a in alarms) and guard.can_restore(step, "replay"):
            return _outcome(skips) + f", restore at {step}"
        guard.observe(step, loss, grad_norm)
    return _outcome(skips)


def _update_cell(trace: dict[str, Any]) -> str:
    """What the update check sees on a trace: the steps it judges, or the largest ratio it leaves."""
    judged = update_check_fires(trace)
    if judged is None:
        return "; updates not recorded"
    fired, largest = judged
    return f"; updates judged at {_steps_text(fired)}" if fired else f"; updates <= {largest:.1f}x"


def _outcome(skips: list[int]) -> str:
    return "0" if not skips else f"{len(skips)} skip{'s' if len(skips) > 1 else ''} ({_steps_text(skips)})"


def _steps_text(steps: list[int]) -> str:
    return ", ".join(map(str, steps[:6])) + (", ..." if len(steps) > 6 else "")


def _steps(trace: dict[str, Any]) -> list[tuple[float, float | None]]:
    norms = trace.get("grad_norms") or [None] * len(trace["losses"])
    return list(zip(trace["losses"], norms, strict=True))


def _name(trace: dict[str, Any]) -> str:
    rate = trace.get("lr_multiplier", 1.0)
    return f"{trace['task']} ({trace['size']}) lr x{rate:g} {trace['fault']} s{trace['seed']}"


def summary(traces: list[dict[str, Any]]) -> str:
    """One row per trace: where the detector alone fires, then per setting what the guard does (clean
    traces: if the batches were to blame / if the weights were; faulted: the fault's own culprit)."""
    lines = [
        "| trace | detector fires at | update check | " + " | ".join(SETTINGS) + " |",
        "|---|---|---|" + "---|" * len(SETTINGS),
    ]
    for trace in traces:
        fired = detector_fires(trace)
        cells = []
        for fields in SETTINGS.values():
            if trace["fault"] == "clean":
                data, weights = replay_guard(trace, fields, DATA), replay_guard(trace, fields, WEIGHTS)
                cells.append(data if data == weights else f"data: {data}; weights: {weights}")
            else:
                blamed = WEIGHTS if trace["fault"] == "lr_burst" else DATA
                start = fault_window(trace["fault"], len(trace["losses"])).start
                cells.append(f"{replay_guard(trace, fields, blamed)} (fault from {start + 1})")
        update = _update_cell(trace).removeprefix("; ")
        lines.append(
            f"| {_name(trace)} | {_steps_text(fired) or '-'} | {update} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines)


def clean_table(traces: list[dict[str, Any]]) -> str:
    """The verdict table's clean runs under the shipped settings: per task and rate, per seed, what the
    guard does (whichever the second measurement blames) and where the detector alone fired."""
    arena = [
        t for t in traces if t["fault"] == "clean"
    ]  # any clean run at the rate (x1 may be the tuned one)
    lines = ["| task | lr | seed 0 | seed 1 | seed 2 |", "|---|---|---|---|---|"]
    for task in ARENA_TASKS:
        tuned = tuned_multiplier(task)
        if tuned is None:
            lines.append(f"| `{task}` | not tuned yet (its arena record has no full-budget rate) | | | |")
            continue
        for multiplier, label in ((tuned, "tuned"), (2 * tuned, "x2")):
            cells = []
            for seed in ARENA_SEEDS:
                trace = next(
                    (t for t in arena if trace_key(t) == (task, "full", "clean", seed, multiplier)), None
                )
                if trace is None:
                    cells.append("not recorded")
                    continue
                outcomes = {replay_guard(trace, {}, DATA), replay_guard(trace, {}, WEIGHTS)}
                acted = " / ".join(sorted(outcomes))
                fired = detector_fires(trace)
                where = f" (fired at {_steps_text(fired)})" if fired else ""
                cells.append(("0 actions" if outcomes == {"0"} else acted) + where + _update_cell(trace))
            rate = get_task(task).learning_rate * multiplier
            lines.append(f"| `{task}` | {label} ({rate:g}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="benchmarks/results/spike_replay/spike_replay.json")
    parser.add_argument("--replay_only", action="store_true", help="replay the recorded traces, train none")
    parser.add_argument("--tasks", nargs="+", default=list(ARENA_TASKS), help="record these tasks' only")
    parser.add_argument(
        "--add_update_norms",
        action="store_true",
        help="record again the traces recorded before the update norms were (their losses must come out "
        "the same), to add them",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    out = Path(args.out)
    traces = json.loads(out.read_text()) if out.is_file() else []
    done = {trace_key(t) for t in traces if "update_norms" in t or not args.add_update_norms}
    if not args.replay_only:
        # the verdict table's clean runs and the lr bursts first: what the update check is judged on
        order = sorted(wanted_traces(), key=lambda w: w[2] != "lr_burst" and w[5] == 1)
        for task_name, size, fault, seed, multiplier, eval_points in order:
            if (task_name, size, fault, seed, multiplier) in done or task_name not in args.tasks:
                continue
            new = record(task_name, size, fault, seed, multiplier, eval_points)
            old = [i for i, t in enumerate(traces) if trace_key(t) == trace_key(new)]
            if old and traces[old[0]]["losses"] != new["losses"]:  # the task or the libraries changed since
                pairs = zip(traces[old[0]]["losses"], new["losses"], strict=False)
                first = next((i for i, (a, b) in enumerate(pairs) if a != b), len(new["losses"]))
                print(f"{_name(new)}: recorded again, its losses differ from step {first + 1}", flush=True)
                new["differs_from_stored_at"] = first + 1
            traces = [t for i, t in enumerate(traces) if i not in old] + [new]
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(traces) + "\n")
            print(
                f"{task_name} x{multiplier:g} {fault} seed {seed}: {len(traces[-1]['losses'])} steps, "
                f"eval loss {traces[-1]['eval_loss']:.4f}",
                flush=True,
            )
    table = clean_table(traces) + "\n\n" + summary(traces)
    out.with_suffix(".md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
