"""`hf-hybrid bench --faults`: what a loss spike costs a run, with and without the spike guard.

Faults at mid-run: `lr_burst` (the rate x30 for 3 steps), `garbage` (2 batches of random tokens),
`shuffled_labels` (5 batches whose labels are permuted across rows). Each arm runs clean and faulted on
every seed. Controls, asked for by name, are no fault: `skip_clean_2` and `skip_clean_5` skip the
optimizer step of 2 (5) clean batches in the garbage (shuffled labels) window, which is what the guard
does to the faulted ones: what skipping costs by itself, the scale below which "worse than plain" on a
data fault cannot be told from the skip. `replay_clean_2` and `replay_clean_5` train the window's steps
on the clean batches just before it, again: what a guard that put recent clean data in a blamed batch's
place would keep of the steps a skip loses. With `eval_points` > 1 each fault is also read where the
clean plain run's eval loss is lowest (on a task that overfits, wasted steps lower every arm's final loss).
"""

from __future__ import annotations

import json
import statistics
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import Trainer, TrainerCallback

from ..methods import Method, TrialContext, parse_method
from ..runner import run_trial
from ..task import BenchTask

FAULTS = ("lr_burst", "garbage", "shuffled_labels")
SKIPS = ("skip_clean_2", "skip_clean_5")
REPLAYS = ("replay_clean_2", "replay_clean_5")
CONTROLS = SKIPS + REPLAYS
LR_FACTOR, LR_STEPS = 30.0, 3
GARBAGE_STEPS, SHUFFLED_STEPS = 2, 5
CLEAN = "clean"
GUARDED = "hybrid:spike_guard=on"  # the hybrid trainer with its spike guard on, whatever the model


@dataclass(frozen=True)
class FaultWindow:
    """Which optimizer steps (0-based global step before the step runs) a fault touches."""

    kind: str
    start: int
    steps: int

    def covers(self, step: int) -> bool:
        return self.start <= step < self.start + self.steps


def fault_window(kind: str, max_steps: int) -> FaultWindow:
    if kind not in FAULTS + CONTROLS:
        raise ValueError(f"unknown fault {kind!r}; faults: {list(FAULTS)}, controls: {list(CONTROLS)}")
    length = {
        "lr_burst": LR_STEPS,
        "garbage": GARBAGE_STEPS,
        "shuffled_labels": SHUFFLED_STEPS,
        "skip_clean_2": GARBAGE_STEPS,
        "skip_clean_5": SHUFFLED_STEPS,
        "replay_clean_2": GARBAGE_STEPS,
        "replay_clean_5": SHUFFLED_STEPS,
    }[kind]
    return FaultWindow(kind, max_steps // 2, length)


class LearningRateBurst(TrainerCallback):
    """Multiplies every group's lr in the window's steps; the scheduler resets it at the next step."""

    def __init__(self, window: FaultWindow) -> None:
        self.window = window

    def on_step_begin(
        self, args: Any, state: Any, control: Any, optimizer: Any = None, **kwargs: Any
    ) -> None:
        if self.window.covers(state.global_step):
            for group in optimizer.param_groups:
                group["lr"] *= LR_FACTOR


class SkippedSteps(TrainerCallback):
    """The optimizer step of the window's steps never runs (their batches' forward and backward do, the
    schedule moves on), as the guard's skip of a batch it blames."""

    def __init__(self, window: FaultWindow) -> None:
        self.window = window
        self.step = 0

    def on_train_begin(
        self, args: Any, state: Any, control: Any, optimizer: Any = None, **kwargs: Any
    ) -> None:
        original = optimizer.step

        def step(*args: Any, **kwargs: Any) -> Any:
            return None if self.window.covers(self.step) else original(*args, **kwargs)

        optimizer.step = step

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.step = state.global_step


def corrupt(inputs: dict[str, Any], kind: str, generator: torch.Generator, vocab: int) -> dict[str, Any]:
    """The batch as the fault delivers it (a new dict; the caller's tensors are not touched)."""
    inputs = dict(inputs)
    ids = inputs["input_ids"]
    if kind == "garbage":
        noise = torch.randint(0, vocab, ids.shape, generator=generator).to(ids.device)
        inputs["input_ids"] = noise
        if "labels" in inputs and inputs["labels"].shape == ids.shape:
            inputs["labels"] = noise.clone()
    elif kind == "shuffled_labels":
        # one random cycle through all rows: no row keeps its own labels
        cycle = torch.randperm(ids.shape[0], generator=generator)
        order = torch.empty_like(cycle)
        order[cycle] = torch.roll(cycle, -1)
        inputs["labels"] = inputs["labels"][order.to(inputs["labels"].device)]
    return inputs


def inject(trainer: Trainer, window: FaultWindow, seed: int) -> Trainer:
    """Make `trainer` deliver the fault: a callback for the lr, a wrapped `training_step` for the data."""
    if window.kind == "lr_burst":
        trainer.add_callback(LearningRateBurst(window))
        return trainer
    if window.kind in SKIPS:
        trainer.add_callback(SkippedSteps(window))
        return trainer
    if window.kind in REPLAYS:
        return _replay_before(trainer, window)
    generator = torch.Generator().manual_seed(seed)
    vocab = trainer.model.config.vocab_size if hasattr(trainer.model, "config") else 256
    original = trainer.training_step

    def training_step(self: Trainer, model: Any, inputs: Any, num_items_in_batch: Any = None) -> torch.Tensor:
        if window.covers(self.state.global_step):
            inputs = corrupt(inputs, window.kind, generator, vocab)
        return original(model, inputs, num_items_in_batch)

    trainer.training_step = types.MethodType(training_step, trainer)
    return trainer


def _replay_before(trainer: Trainer, window: FaultWindow) -> Trainer:
    """The window's steps train on the `window.steps` batches just before it, in their order (each with
    its own item count, which a token-averaged loss divides by)."""
    if trainer.args.gradient_accumulation_steps != 1:
        raise ValueError("the replay controls replay whole optimizer steps: gradient_accumulation_steps 1")
    recent: list[tuple[dict[str, Any], Any]] = []
    original = trainer.training_step

    def training_step(self: Trainer, model: Any, inputs: Any, num_items_in_batch: Any = None) -> torch.Tensor:
        step = self.state.global_step
        if window.covers(step):
            inputs, num_items_in_batch = recent[step - window.start]
        elif window.start - window.steps <= step < window.start:  # only the batches it will replay
            kept = {k: v.clone() if torch.is_tensor(v) else v for k, v in inputs.items()}
            recent.append((kept, num_items_in_batch))
        return original(model, inputs, num_items_in_batch)

    trainer.training_step = types.MethodType(training_step, trainer)
    return trainer


class Faulted(Method):
    """Another method's run with a fault injected (not registered: the fault benchmark builds it)."""

    def __init__(self, inner: Method, fault: str) -> None:
        super().__init__(inner.spec, {})
        self.inner, self.fault = inner, fault

    def build(self, ctx: TrialContext) -> Trainer:
        trainer = self.inner.build(ctx)
        return inject(trainer, fault_window(self.fault, ctx.steps), ctx.seed)

    def step_counts(self, trainer: Trainer, steps: int) -> dict[str, int]:
        return self.inner.step_counts(trainer, steps)

    def describe_run(self, trainer: Trainer) -> dict[str, Any]:
        return self.inner.describe_run(trainer)


def run_faults(
    task: BenchTask,
    arms: Sequence[str],
    faults: Sequence[str] = FAULTS,
    seeds: Sequence[int] = (0, 1, 2),
    learning_rate: float | None = None,
    out: str | Path = "bench_results/faults",
    echo: Callable[[str], None] = print,
    eval_points: int = 1,
) -> Path:
    """Every arm clean and under every fault, on every seed, into `faults.json` (resumable) and `.md`."""
    for fault in faults:
        fault_window(fault, task.max_steps)
    if not isinstance(eval_points, int) or eval_points < 1:
        raise ValueError(f"--fault_eval_points must be an integer >= 1, not {eval_points!r}")
    methods = {spec: parse_method(spec) for spec in arms}
    path = Path(out) / "faults.json"
    record = json.loads(path.read_text()) if path.is_file() else {"task": task.describe(), "runs": []}
    if record.setdefault("eval_points", eval_points) != eval_points:
        raise ValueError(f"{path} was made with eval_points {record['eval_points']}, not {eval_points}")
    done = {(r["arm"], r["fault"], r["seed"]) for r in record["runs"]}
    lr = learning_rate or task.learning_rate
    for seed in seeds:
        for fault in (CLEAN, *faults):
            for spec, method in methods.items():
                if (spec, fault, seed) in done:
                    continue
                runner = method if fault == CLEAN else Faulted(method, fault)
                result = run_trial(
                    task, runner, learning_rate=lr, seed=seed, steps=task.max_steps, eval_points=eval_points
                )
                record["runs"].append(_row(spec, fault, seed, result))
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(record, indent=1) + "\n")
                echo(f"{task.name} seed {seed} {fault:<16} {spec:<30} eval loss {result.eval_loss:.4f}")
    tables = fault_table(record) + ("\n\n" + best_point_table(record) if eval_points > 1 else "")
    (Path(out) / "faults.md").write_text(tables + "\n")
    echo(tables)
    return path


def _row(arm: str, fault: str, seed: int, result: Any) -> dict[str, Any]:
    """What the record keeps of one run: its eval loss and curve, time and memory, the guard's actions."""
    stats = result.stats
    guard_share = stats.get("timing", {}).get("parts", {}).get("spike_guard")
    kept = ("restores", "spike_skipped_steps", "skips", "replays", "spike_guard_bytes")
    listed = ("restore_steps", "taken_back_steps", "scaled_back_steps", "replay_steps")
    return {
        "arm": arm,
        "fault": fault,
        "seed": seed,
        "eval_loss": result.eval_loss,
        "seconds": result.train_seconds,
        "engine_peak_bytes": result.engine_peak_bytes,
        "trainable_bytes": result.trainable_bytes,
        **{key: stats.get(key, 0) for key in kept},
        **{key: stats.get(key, []) for key in listed},
        "copy_every": stats.get("spike_guard_copy_every"),
        "spike_guard_time_share": guard_share,
        "update_check": stats.get("update_check", False),
        "largest_update_ratio": stats.get("largest_update_ratio"),
        "update_check_copies": stats.get("update_check_copies"),
        "unjudged_updates": stats.get("unjudged_updates"),
        "curve": [[point["step"], point["eval_loss"]] for point in result.curve],
    }


def best_point_table(record: dict[str, Any]) -> str:
    """Per fault, arm and seed: the loss at clean plain's best step, minus the arm's clean loss there."""
    curves = {
        (r["arm"], r["fault"], r["seed"]): dict(map(tuple, r["curve"]))
        for r in record["runs"]
        if r.get("curve")
    }
    best = {
        seed: min(curve, key=curve.__getitem__)
        for (arm, fault, seed), curve in curves.items()
        if (arm, fault) == ("plain", CLEAN)
    }
    lines = [
        "| fault | arm | seed | read at step (clean plain's best) | eval loss there | − clean there |",
        "|---|---|---|---|---|---|",
    ]
    for (arm, fault, seed), curve in curves.items():
        clean = curves.get((arm, CLEAN, seed), {})
        step = best.get(seed)
        if fault == CLEAN or step not in curve or step not in clean:
            continue
        loss = curve[step]
        lines.append(f"| {fault} | `{arm}` | {seed} | {step} | {loss:.4f} | {loss - clean[step]:+.4f} |")
    return "\n".join(lines)


def fault_table(record: dict[str, Any]) -> str:
    """Per fault and arm: final eval loss (mean over seeds, range), minus the same arm's clean run."""
    runs = record["runs"]
    arms = list(dict.fromkeys(r["arm"] for r in runs))
    faults = list(dict.fromkeys(r["fault"] for r in runs))
    lines = [
        "| fault | arm | eval loss (mean, min–max over seeds) | − clean (mean) | restores "
        "| updates taken back | time / clean | guard's time share | guard's copies |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for fault in faults:
        for arm in arms:
            mine = [r for r in runs if r["arm"] == arm and r["fault"] == fault]
            clean = {r["seed"]: r for r in runs if r["arm"] == arm and r["fault"] == CLEAN}
            if not mine:
                continue
            losses = [r["eval_loss"] for r in mine]
            delta = statistics.fmean(
                r["eval_loss"] - clean[r["seed"]]["eval_loss"] for r in mine if r["seed"] in clean
            )
            time = statistics.fmean(
                r["seconds"] / clean[r["seed"]]["seconds"] for r in mine if r["seed"] in clean
            )
            shares = [r["spike_guard_time_share"] for r in mine if r.get("spike_guard_time_share")]
            share = f"{statistics.fmean(shares):.2%}" if shares else "–"
            copies = max(r.get("spike_guard_bytes", 0) for r in mine)
            lines.append(
                f"| {fault} | `{arm}` | {statistics.fmean(losses):.4f} ({min(losses):.4f}–{max(losses):.4f}) "
                f"| {delta:+.4f} | {sum(r['restores'] for r in mine)} "
                f"| {sum(len(r.get('taken_back_steps', [])) for r in mine)} | {time:.3f} | {share} "
                f"| {copies / 2**20:.1f} MiB |"
            )
    return "\n".join(lines)
