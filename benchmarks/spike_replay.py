"""Replay the spike guard's detector on recorded loss traces: which settings fire on clean runs, which
catch the faults.

Each trace is one plain `Trainer` run of a bench task (clean, or with a `--faults` fault at mid-run), its
loss recorded every step, replayed as the guard would read it (up to a restore: the guarded run differs
after). Traces stay in the JSON, so new settings replay for free (`--replay_only`):

    python benchmarks/spike_replay.py --out benchmarks/results/spike_replay/spike_replay.json

A corpus of clean runs of other shapes (`CORPUS`) is recorded too, and the field's guards
(`peer_guards.py`) are replayed beside the spike guard: actions per 1,000 clean steps, exact Poisson CI.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from peer_guards import loss_skip_actions, zclip_actions
from transformers import Trainer, TrainerCallback

from hf_hybrid.bench.measure.faults import FAULTS, Faulted, fault_window
from hf_hybrid.bench.methods import parse_method
from hf_hybrid.bench.runner import run_trial
from hf_hybrid.bench.tasks import get_task
from hf_hybrid.engine.config import SpikeGuardConfig
from hf_hybrid.engine.spike_blame import DATA, WEIGHTS, detector_for
from hf_hybrid.engine.spike_guard import SpikeGuard
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
# arena tuned (`decisions.plain.best["1.0"]` of the committed record) and at twice it, the edge of stability.
ARENA_TASKS = ("minilm_lora", "minilm_cls", "decoder_lora", "decoder_ft", "clm_stdlib")
ARENA_SEEDS = (0, 1, 2)
ARENA_RECORDS = Path("benchmarks/results/arena")
ARENA_EVAL_POINTS = 4
# Clean runs of other shapes (issue 49): name -> (task, size, lr multipliers of the task's default rate,
# seeds, overrides of the task: batch size, steps, how many training and eval examples it keeps).
CORPUS = {
    "memorised": (
        "minilm_cls",
        "full",
        (0.5, 1.0),
        (0, 1),
        {"batch_size": 16, "max_steps": 160, "train": 256},
    ),
    "memorised_b4": ("minilm_cls", "full", (0.5,), (0,), {"batch_size": 4, "max_steps": 480, "train": 192}),
    "clm_b1": ("clm_stdlib", "quick", (1.0, 2.0), (0,), {"batch_size": 1, "max_steps": 600}),
    "clm_b2": ("clm_stdlib", "quick", (1.0,), (0, 1), {"batch_size": 2, "max_steps": 600}),
    "clm_b4_long": ("clm_stdlib", "quick", (1.0,), (0,), {"batch_size": 4, "max_steps": 3000}),
    "decoder_lora_b2": ("decoder_lora", "full", (1.0,), (0,), {"batch_size": 2, "max_steps": 400}),
    "decoder_ft_b2": ("decoder_ft", "full", (1.0,), (0,), {"batch_size": 2, "max_steps": 400}),
    "minilm_lora_b2": ("minilm_lora", "full", (1.0,), (0,), {"batch_size": 2, "max_steps": 400}),
}
CORPUS_EVAL_EXAMPLES = 256  # the corpus's runs are read for their training traces: a small eval set
SETTINGS = {  # name: SpikeGuardConfig fields
    "patience 1 (restore at once)": {"patience": 1},
    "patience 2 (the default)": {},
    "patience 4": {"patience": 4},
    "patience 6": {"patience": 6},
    "patience 2, rise 0.2": {"min_rise": 0.2},
}


class LossTrace(TrainerCallback):
    """Records every step's loss, gradient norm and applied update's norm (no gradient accumulation)."""

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
    """The full budget's best rate multiplier in the arena's committed record, or None while it has none."""
    path = ARENA_RECORDS / task_name / "results.json"
    if not path.is_file():
        return None
    decisions = json.loads(path.read_text()).get("decisions", {})
    best = decisions.get("plain", decisions).get("best", {}).get("1.0")  # plain's, since issue 48's records
    return None if best is None else float(best)


def record(
    task_name: str,
    size: str,
    fault: str,
    seed: int,
    lr_multiplier: float = 1.0,
    eval_points: int = 1,
    variant: str | None = None,
) -> dict[str, Any]:
    """One plain run's trace (evaluation moves the random state); a corpus `variant` has its overrides."""
    task = _task(task_name, size, variant)
    method = parse_method("plain")
    runner = method if fault == "clean" else Faulted(method, fault)
    trace = LossTrace()
    rate = task.learning_rate * lr_multiplier
    runs = {"seed": seed, "steps": task.max_steps, "eval_points": eval_points, "callbacks": [trace]}
    result = run_trial(task, runner, learning_rate=rate, **runs)
    start = None if fault == "clean" else fault_window(fault, task.max_steps).start
    return {
        "task": task_name,
        "size": size,
        "fault": fault,
        "seed": seed,
        "fault_start": start,
        "lr_multiplier": lr_multiplier,
        "learning_rate": rate,
        "eval_loss": result.eval_loss,
        "losses": trace.losses,
        "grad_norms": trace.grad_norms,
        "update_norms": trace.update_norms,
        **({"variant": variant, "batch_size": task.batch_size} if variant else {}),
    }


def _task(task_name: str, size: str, variant: str | None) -> Any:
    """The bench task at a size, with a corpus variant's overrides (fewer examples: more epochs)."""
    task = get_task(task_name).bench_task(size)
    if variant is None:
        return task
    overrides = dict(CORPUS[variant][4])
    train = task.train.select(range(min(len(task.train), overrides.pop("train", len(task.train)))))
    evaluation = task.evaluation.select(range(min(len(task.evaluation), CORPUS_EVAL_EXAMPLES)))
    return dataclasses.replace(task, train=train, evaluation=evaluation, eval_clusters=None, **overrides)


def wanted_traces() -> list[tuple[str, str, str, int, float, int, str | None]]:
    """(task, size, fault, seed, rate multiplier, evaluations, corpus variant) of every trace, in order."""
    wanted = [
        (task, size, fault, seed, 1.0, 1, None)
        for task, size, clean_seeds, fault_seeds in TRACES
        for fault, seed in [("clean", s) for s in clean_seeds] + [(f, s) for f in FAULTS for s in fault_seeds]
    ]
    for task in ARENA_TASKS:
        tuned = tuned_multiplier(task)
        if tuned is not None:
            wanted += [
                (task, "full", "clean", seed, m, ARENA_EVAL_POINTS, None)
                for seed in ARENA_SEEDS
                for m in (tuned, 2 * tuned)
            ]
    return wanted + corpus_traces()


def corpus_traces() -> list[tuple[str, str, str, int, float, int, str | None]]:
    """The corpus's clean runs, cheapest first."""
    return [
        (task, size, "clean", seed, rate, 1, name)
        for name, (task, size, rates, seeds, _) in CORPUS.items()
        for rate in rates
        for seed in seeds
    ]


def trace_key(trace: dict[str, Any]) -> tuple[str, str, str, int, float, str | None]:
    key = trace["task"], trace["size"], trace["fault"], trace["seed"], trace.get("lr_multiplier", 1.0)
    return (*key, trace.get("variant"))


def detector_fires(trace: dict[str, Any]) -> list[int]:
    """The 1-based steps at which the guard's detector fires when every step is applied (as in plain)."""
    detector = detector_for(SpikeGuardConfig())
    fired: list[int] = []
    for step, (loss, grad_norm) in enumerate(_steps(trace), start=1):
        lasting = detector.lasting(loss) and detector.elevated(loss)  # a shift whose own step is up too
        after_spike = bool(fired) and fired[-1] == step - 1
        if lasting or detector.sudden(loss, grad_norm, after_spike):
            fired.append(step)
        detector.add(loss, grad_norm, step)
    return fired


def update_check_fires(trace: dict[str, Any]) -> tuple[list[int], float] | None:
    """Steps whose update the shipped `UpdateCheck` judges outsized, and the largest ratio it leaves."""
    if "update_norms" not in trace:
        return None
    config = SpikeGuardConfig()
    limits = {"history": config.history, "min_history": config.min_history}
    check = UpdateCheck([], max_ratio=config.max_update_ratio, suspect_loss=None, **limits)
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
    """The shipped `SpikeGuard` over a trace, `blamed` to blame: its skips and first restore (1-based)."""
    measured: dict[str, float] = {}

    def suspect_loss() -> float:
        return measured["data"] if blamed == DATA else measured["weights"]

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    guard = SpikeGuard(optimizer, SpikeGuardConfig(**fields), suspect_loss=suspect_loss)
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
    rate, variant = trace.get("lr_multiplier", 1.0), trace.get("variant")
    size = f"{variant}, batch {trace['batch_size']}" if variant else trace["size"]
    return f"{trace['task']} ({size}) lr x{rate:g} {trace['fault']} s{trace['seed']}"


def guard_actions(trace: dict[str, Any]) -> int:
    """The spike guard's actions on a clean trace (the more of either blame) and the update check's."""
    counts = [_count(replay_guard(trace, {}, culprit)) for culprit in (DATA, WEIGHTS)]
    judged = update_check_fires(trace)
    return max(counts) + (len(judged[0]) if judged else 0)


def _count(outcome: str) -> int:
    skips = 0 if outcome.startswith("0") else int(outcome.split(" ")[0])
    return skips + ("restore" in outcome)


def corpus_table(traces: list[dict[str, Any]]) -> str:
    """The corpus's clean runs, one row each: where the detector fired, and what each guard does."""
    lines = [
        "| run | steps | eval loss | detector fired at | spike guard | 6-sigma loss skip | ZClip clips |",
        "|---|---|---|---|---|---|---|",
    ]
    for trace in (t for t in traces if t.get("variant")):
        fired, peers = detector_fires(trace), _peer_actions(trace)
        cells = [f"{len(a)} ({_steps_text(a)})" if a else "0" for a in peers]
        lines.append(
            f"| {_name(trace)} | {len(trace['losses'])} | {trace['eval_loss']:.4f} | "
            f"{_steps_text(fired) or '-'} | {guard_actions(trace)} | {cells[0]} | {cells[1]} |"
        )
    return "\n".join(lines)


def _peer_actions(trace: dict[str, Any]) -> tuple[list[int], list[int]]:
    norms = trace.get("grad_norms") or [None] * len(trace["losses"])
    return loss_skip_actions(trace["losses"], norms), zclip_actions(norms)


def false_alarm_table(traces: list[dict[str, Any]]) -> str:
    """Each guard's actions per 1,000 clean steps (exact 95% Poisson CI), then `_fault_catch_table`."""
    clean = [t for t in traces if t["fault"] == "clean" and t.get("grad_norms")]
    steps = sum(len(t["losses"]) for t in clean)
    counts = [sum(guard_actions(t) for t in clean)]
    peers = [_peer_actions(t) for t in clean]
    counts += [sum(len(p[0]) for p in peers), sum(len(p[1]) for p in peers)]
    lines = [
        f"| guard | actions on {len(clean)} clean runs ({steps} steps) | per 1,000 clean steps (95% CI) |",
        "|---|---|---|",
    ]
    names = ("spike guard", "6-sigma loss skip (128 steps)", "ZClip (2.5 sigma)")
    for name, count in zip(names, counts, strict=True):
        rate, low, high = (1000 * x / steps for x in (count, *poisson_interval(count)))
        lines.append(f"| {name} | {count} | {rate:.2f} ({low:.2f}-{high:.2f}) |")
    return "\n".join(lines) + "\n\n" + _fault_catch_table(traces)


def _fault_catch_table(traces: list[dict[str, Any]]) -> str:
    """Per faulted trace: the fault's steps each guard acts on (the spike guard with the fault's culprit)."""
    lines = [
        "| faulted trace | fault's steps | spike guard | 6-sigma loss skip | ZClip clips |",
        "|---|---|---|---|---|",
    ]
    for trace in (t for t in traces if t["fault"] != "clean" and t.get("grad_norms")):
        window = fault_window(trace["fault"], len(trace["losses"]))
        inside = range(window.start + 1, window.start + window.steps + 1)
        blamed = WEIGHTS if trace["fault"] == "lr_burst" else DATA
        peers = [[s for s in acted if s in inside] for acted in _peer_actions(trace)]
        lines.append(
            f"| {_name(trace)} | {inside.start}-{inside.stop - 1} | {replay_guard(trace, {}, blamed)} | "
            f"{len(peers[0])}/{window.steps} | {len(peers[1])}/{window.steps} |"
        )
    return "\n".join(lines)


def poisson_interval(count: int, level: float = 0.95) -> tuple[float, float]:
    """The exact (Garwood) interval of a Poisson mean from one count."""
    tail = (1 - level) / 2

    def cdf(k: int, mean: float) -> float:  # in logs: exp(-mean) alone underflows for large counts
        return sum(math.exp(i * math.log(mean) - mean - math.lgamma(i + 1)) for i in range(k + 1))

    def solve(target: Callable[[float], float]) -> float:
        low, high = 0.0, 10.0 * count + 10.0
        for _ in range(100):
            mid = (low + high) / 2
            low, high = (mid, high) if target(mid) > 0 else (low, mid)
        return (low + high) / 2

    lower = 0.0 if count == 0 else solve(lambda m: tail - (1 - cdf(count - 1, m)))
    return lower, solve(lambda m: cdf(count, m) - tail)


def summary(traces: list[dict[str, Any]]) -> str:
    """One row per trace: where the detector fires, and per setting what the guard does."""
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
    """The verdict table's clean runs under the shipped settings, per task, rate and seed."""
    arena = [t for t in traces if t["fault"] == "clean"]  # any clean run at the rate (x1 may be tuned)
    lines = ["| task | lr | seed 0 | seed 1 | seed 2 |", "|---|---|---|---|---|"]
    for task in ARENA_TASKS:
        tuned = tuned_multiplier(task)
        if tuned is None:
            lines.append(f"| `{task}` | not tuned yet (its arena record has no full-budget rate) | | | |")
            continue
        for multiplier, label in ((tuned, "tuned"), (2 * tuned, "x2")):
            cells = []
            for seed in ARENA_SEEDS:
                key = (task, "full", "clean", seed, multiplier, None)
                trace = next((t for t in arena if trace_key(t) == key), None)
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
    parser.add_argument("--corpus_only", action="store_true", help="record the corpus's runs only")
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
        order = corpus_traces() if args.corpus_only else wanted_traces()
        for task_name, size, fault, seed, multiplier, eval_points, variant in order:
            if (task_name, size, fault, seed, multiplier, variant) in done or task_name not in args.tasks:
                continue
            new = record(task_name, size, fault, seed, multiplier, eval_points, variant)
            old = [i for i, t in enumerate(traces) if trace_key(t) == trace_key(new)]
            if old and traces[old[0]]["losses"] != new["losses"]:  # the task or the libraries changed since
                pairs = zip(traces[old[0]]["losses"], new["losses"], strict=False)
                first = next((i for i, (a, b) in enumerate(pairs) if a != b), len(new["losses"]))
                print(f"{_name(new)}: recorded again, its losses differ from step {first + 1}", flush=True)
                new["differs_from_stored_at"] = first + 1
            traces = [t for i, t in enumerate(traces) if i not in old] + [new]
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(traces) + "\n")
            print(f"{_name(new)}: {len(new['losses'])} steps, eval loss {new['eval_loss']:.4f}", flush=True)
    table = "\n\n".join(f(traces) for f in (clean_table, corpus_table, false_alarm_table, summary))
    out.with_suffix(".md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
