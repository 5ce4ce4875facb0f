"""The field's guards against loss spikes, beside the spike guard: replayed on recorded traces
(`spike_replay.py`) and as `Trainer` subclasses the fault bench runs
(`hf-hybrid bench --faults --methods benchmarks.peer_guards:LossSkipTrainer ...`, with `PYTHONPATH=.`).

- `LossSkip`: skip a step whose loss or gradient norm is over 6 std above the mean of the last 128 steps
  (OLMo-core's `SkipStepOptimizer` defaults).
- `ZClip` (Kumar et al., 2025): EMA mean and variance of the gradient norm (alpha 0.97, from the first 25
  steps); a norm over 2.5 std above the mean is clipped to mean + (2.5^2 / z) std (reciprocal mode).

Both are written from their papers' descriptions, not copied.

The damage each guard recovers, per fault, from the records that hold all their arms:

    cd benchmarks/results/faults && python ../../peer_guards.py current_tasks instruct_docstrings
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections import deque
from pathlib import Path
from typing import Any

import torch
from transformers import Trainer

LOSS_SKIP_WINDOW, LOSS_SKIP_SIGMA = 128, 6.0
# the fault bench's arm names of the three guards, as the damage table shows them
GUARD_ARMS = {
    "spike guard": "hybrid:spike_guard=on",
    "6-sigma loss skip": "benchmarks.peer_guards:LossSkipTrainer",
    "ZClip": "benchmarks.peer_guards:ZClipTrainer",
}
ZCLIP_ALPHA, ZCLIP_Z, ZCLIP_WARMUP = 0.97, 2.5, 25


class LossSkip:
    """Skip a step whose loss or gradient norm is far above the window's mean (none until it is full)."""

    def __init__(self) -> None:
        self.losses: deque[float] = deque(maxlen=LOSS_SKIP_WINDOW)
        self.norms: deque[float] = deque(maxlen=LOSS_SKIP_WINDOW)

    def skips(self, loss: float, grad_norm: float | None) -> bool:
        skip = _far(self.losses, loss) or (grad_norm is not None and _far(self.norms, grad_norm))
        self.losses.append(loss)
        if grad_norm is not None:
            self.norms.append(grad_norm)
        return skip


def _far(window: deque[float], value: float) -> bool:
    if len(window) < LOSS_SKIP_WINDOW:
        return False
    mean, std = statistics.fmean(window), statistics.pstdev(window)
    return value - mean > LOSS_SKIP_SIGMA * max(std, 1e-12)


class ZClip:
    """The clip threshold for each step's gradient norm (None: not clipped)."""

    def __init__(self) -> None:
        self.warmup: list[float] = []
        self.mean = self.var = 0.0

    def threshold(self, norm: float) -> float | None:
        if len(self.warmup) < ZCLIP_WARMUP:
            self.warmup.append(norm)
            if len(self.warmup) == ZCLIP_WARMUP:
                self.mean, self.var = statistics.fmean(self.warmup), statistics.pvariance(self.warmup)
            return None
        std = math.sqrt(max(self.var, 1e-24))
        z = (norm - self.mean) / std
        clipped = self.mean + (ZCLIP_Z**2 / z) * std if z > ZCLIP_Z else None
        seen = norm if clipped is None else clipped
        self.mean = ZCLIP_ALPHA * self.mean + (1 - ZCLIP_ALPHA) * seen
        self.var = ZCLIP_ALPHA * self.var + (1 - ZCLIP_ALPHA) * (seen - self.mean) ** 2
        return clipped


def loss_skip_actions(losses: list[float], grad_norms: list[float | None]) -> list[int]:
    """The 1-based steps `LossSkip` skips on a recorded trace."""
    rule = LossSkip()
    return [
        step
        for step, (loss, norm) in enumerate(zip(losses, grad_norms, strict=True), 1)
        if rule.skips(loss, norm)
    ]


def zclip_actions(grad_norms: list[float | None]) -> list[int]:
    """The 1-based steps `ZClip` clips on a recorded trace (the norms before the Trainer's own clip)."""
    rule = ZClip()
    return [
        step
        for step, norm in enumerate(grad_norms, 1)
        if norm is not None and rule.threshold(norm) is not None
    ]


class LossSkipTrainer(Trainer):
    """The plain `Trainer` with `LossSkip`: a skipped step's optimizer step is not taken."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rule, self.skipped, self._loss, self._skip = LossSkip(), [], math.nan, False

    def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> torch.Tensor:
        loss = super().training_step(model, inputs, num_items_in_batch)
        self._loss = float(loss.detach())
        return loss

    def _clip_grad_norm(self, model: Any) -> Any:
        norm = super()._clip_grad_norm(model)
        self._skip = self.rule.skips(self._loss, None if norm is None else float(norm))
        if self._skip:
            self.skipped.append(self.state.global_step + 1)
            model.zero_grad()
        return norm

    def create_optimizer(self, *args: Any, **kwargs: Any) -> Any:
        optimizer = super().create_optimizer(*args, **kwargs)
        step = optimizer.step

        def guarded_step(*step_args: Any, **step_kwargs: Any) -> Any:
            return None if self._skip else step(*step_args, **step_kwargs)

        optimizer.step = guarded_step
        return optimizer


class ZClipTrainer(Trainer):
    """The plain `Trainer` with `ZClip` before its own `max_grad_norm` clip."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rule, self.clipped = ZClip(), []

    def _clip_grad_norm(self, model: Any) -> Any:
        params = [p for p in model.parameters() if p.grad is not None]
        norm = float(torch.nn.utils.get_total_norm([p.grad for p in params]))
        limit = self.rule.threshold(norm)
        if limit is not None:
            self.clipped.append(self.state.global_step + 1)
            torch.nn.utils.clip_grad_norm_(params, limit)
        clipped_norm = super()._clip_grad_norm(model)
        return norm if limit is not None else clipped_norm


def damages(record: dict[str, Any], arm: str, fault: str, seeds: list[int]) -> list[float]:
    """Per seed: the arm's final eval loss under `fault` minus its own clean run's."""
    runs = {(r["arm"], r["fault"], r["seed"]): r["eval_loss"] for r in record["runs"]}
    return [runs[arm, fault, seed] - runs[arm, "clean", seed] for seed in seeds]


def damage_table(records: dict[str, dict[str, Any]]) -> str:
    """Per record and fault: plain's and each guard's mean damage (and share recovered) on shared seeds."""
    lines = [
        "| record | fault | seeds | plain | " + " | ".join(GUARD_ARMS) + " |",
        "|---|---|---|---|" + "---|" * len(GUARD_ARMS),
    ]
    for name, record in records.items():
        present = {(r["arm"], r["fault"], r["seed"]) for r in record["runs"]}
        faults = dict.fromkeys(r["fault"] for r in record["runs"] if r["fault"] != "clean")
        for fault in faults:
            arms = ["plain", *GUARD_ARMS.values()]
            runs = [(arm, f) for arm in arms for f in (fault, "clean")]
            seeds = sorted({s for (_, _, s) in present if all((arm, f, s) in present for arm, f in runs)})
            if not seeds:
                continue
            plain = statistics.fmean(damages(record, "plain", fault, seeds))
            cells = [
                _recovered(statistics.fmean(damages(record, arm, fault, seeds)), plain) for arm in arms[1:]
            ]
            seeds_text = ", ".join(map(str, seeds))
            lines.append(f"| `{name}` | {fault} | {seeds_text} | {plain:+.4f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _recovered(damage: float, plain: float) -> str:
    share = f" ({1 - damage / plain:.0%} recovered)" if plain > 0 else ""
    return f"{damage:+.4f}{share}"


def main() -> None:
    parser = argparse.ArgumentParser(description="The damage each guard recovers, from fault bench records.")
    parser.add_argument("folders", nargs="+", help="folders holding fault bench records (<task>/faults.json)")
    records = {}
    for folder in map(Path, parser.parse_args().folders):
        for path in sorted(folder.rglob("faults.json")):
            name = str(path.parent.relative_to(folder))
            records[folder.name if name == "." else name] = json.loads(path.read_text())
    print(damage_table(records))


if __name__ == "__main__":
    main()
