"""Adaptive freezing (AutoFreeze-style), the per-layer-phase experiment's method, as an arena plug-in.

    hf-hybrid bench --suite full --tasks minilm_cls --seeds 0 1 2 \
        --methods plain freeze:5 "benchmarks.experiments.adaptive_freeze:AdaptiveFreeze:signal=gradnorm"

Every `every` optimizer steps a policy decides whether to freeze the next group of a growing input-side
prefix (the embeddings, then blocks 0 .. n-2; groups with nothing trainable, e.g. the embeddings under
LoRA, are left out). Frozen groups get `requires_grad_(False)`: autograd stops below the lowest trainable
one and AdamW skips them. A step's cost depends on how many groups were frozen at the time, so each
prefix length is its own kind of step, priced by the arena with that prefix frozen from the start.

Signals (one decision per window, from window `ref` + 1 on):
- `update`: s_b = |theta_b(t) - theta_b(t-F)| / (|theta_b(t)| * the window's lr sum); freeze the lowest
  trainable group while s_b / (its largest value in the first `ref` windows) < `tau` for `patience`
  windows in a row.
- `plateau`: the same s_b; freeze while its relative change between windows stays below `tau`.
- `gradnorm` (AutoFreeze 2021): the window's summed gradient norm g_b; freeze the lowest trainable group
  when its change rate |g_b(w) - g_b(w-1)| / g_b(w-1) is below the `tau`-quantile of the trainable groups'.

Verdict (`benchmarks/experiments/results/layer_phases/README.md`): it lost to the lr-tuned plain Trainer
on the MiniLM fine-tune and its LoRA variant; static freezing (`freeze:k`) dominated it everywhere.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from transformers import Trainer, TrainerCallback

from hf_hybrid.bench.methods import STEP, Method, MethodError, TrialContext
from hf_hybrid.bench.methods.blocks import find_blocks, input_side, trainable

SIGNALS = ("update", "plateau", "gradnorm")


def freezable_groups(model: torch.nn.Module) -> list[list[torch.nn.Parameter]]:
    """The prefix that can be frozen, input side first: the input side, then every block but the last."""
    name, blocks = find_blocks(model)
    groups = [trainable(input_side(model, name))] + [trainable([b]) for b in list(blocks)[:-1]]
    return [g for g in groups if g]


class AdaptiveFreeze(Method):
    name: ClassVar[str] = "adaptive-freeze"
    summary: ClassVar[str] = "freeze a growing input-side prefix, decided every F steps from measured signals"
    option_help: ClassVar[dict[str, str]] = {
        "signal": f"one of {list(SIGNALS)}",
        "every": "steps per window, >= 1",
        "ref": "windows before the first decision, >= 1",
        "tau": "threshold (update, plateau) or quantile (gradnorm), > 0",
        "patience": "windows in a row below tau, >= 1",
        "max_frozen": "most groups frozen, >= 1",
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        self.signal = self.option("signal", str, "update", lambda v: v in SIGNALS, f"one of {list(SIGNALS)}")
        self.every = self.option("every", int, 20, lambda v: v >= 1, ">= 1")
        self.ref = self.option("ref", int, 2, lambda v: v >= 1, ">= 1")
        self.tau = self.option("tau", float, 0.5, lambda v: v > 0, "> 0")
        self.patience = self.option("patience", int, 1, lambda v: v >= 1, ">= 1")
        self.max_frozen = self.option("max_frozen", int, None, lambda v: v >= 1, ">= 1")
        self.groups = 0

    def check_model(self, model: Any) -> None:
        self.groups = len(freezable_groups(model))
        if self.groups == 0:
            raise MethodError(f"method {self.spec!r}: {type(model).__name__} has no freezable group")

    def own_kinds(self) -> tuple[str, ...]:
        return tuple(self.kind(f"frozen{p}") for p in range(1, self.groups + 1))

    def calibration_variant(self, kind: str) -> Method:
        return FrozenPrefix(self.spec, {}, prefix=int(kind.rsplit("frozen", 1)[1]))

    def build(self, ctx: TrialContext) -> Trainer:
        model, train, evaluation = ctx.task.build(ctx.seed)
        freezer = Freezer(freezable_groups(model), self)
        kwargs = ctx.trainer_kwargs(model, train, evaluation)
        kwargs["callbacks"] = [*kwargs["callbacks"], freezer]
        trainer = Trainer(args=ctx.training_arguments(), **kwargs)
        trainer.freezer = freezer
        return trainer

    def step_counts(self, trainer: Trainer, steps: int) -> dict[str, int]:
        at = trainer.freezer.steps_at
        counts = {STEP: at[0], **{self.kind(f"frozen{p}"): n for p, n in enumerate(at) if p > 0 and n}}
        return {k: v for k, v in counts.items() if v or k == STEP}

    def describe_run(self, trainer: Trainer) -> dict[str, Any]:
        return {"frozen_at": trainer.freezer.frozen_at, "steps_at_frozen": trainer.freezer.steps_at}


class FrozenPrefix(Method):
    """Calibration only: the first `prefix` groups frozen from the start."""

    def __init__(self, spec: str, options: dict[str, str], prefix: int) -> None:
        super().__init__(spec, options)
        self.prefix = prefix

    def build(self, ctx: TrialContext) -> Trainer:
        model, train, evaluation = ctx.task.build(ctx.seed)
        for group in freezable_groups(model)[: self.prefix]:
            for p in group:
                p.requires_grad_(False)
        return Trainer(args=ctx.training_arguments(), **ctx.trainer_kwargs(model, train, evaluation))


class Freezer(TrainerCallback):
    """Measures per-group signals every `every` steps and freezes the lowest trainable group on a policy."""

    def __init__(self, groups: list[list[torch.nn.Parameter]], policy: AdaptiveFreeze) -> None:
        self.groups, self.policy = groups, policy
        self.frozen = 0
        self.limit = len(groups) if policy.max_frozen is None else min(policy.max_frozen, len(groups))
        self.snap: list[list[torch.Tensor]] = []
        self.lr_sum = 0.0
        self.grad_acc = [0.0] * len(groups)
        self.prev_grad: list[float | None] = [None] * len(groups)
        self.ref = [0.0] * len(groups)
        self.prev_update: list[float | None] = [None] * len(groups)
        self.below = [0] * len(groups)
        self.window = 0
        self.frozen_at: dict[int, int] = {}
        self.steps_at = [0] * (len(groups) + 1)  # optimizer steps run with p groups frozen

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.snap = [[p.detach().clone() for p in group] for group in self.groups]

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.policy.signal != "gradnorm":
            return
        for b in range(self.frozen, len(self.groups)):
            grads = [p.grad for p in self.groups[b] if p.grad is not None]
            if grads:
                self.grad_acc[b] += float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])))

    def on_optimizer_step(
        self, args: Any, state: Any, control: Any, optimizer: Any = None, **kwargs: Any
    ) -> None:
        self.lr_sum += float(optimizer.param_groups[0]["lr"])

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.steps_at[self.frozen] += 1
        if state.global_step % self.policy.every or state.global_step >= state.max_steps:
            return
        self.window += 1
        updates, plateaus, rates = {}, {}, {}
        for b in range(self.frozen, len(self.groups)):
            with torch.no_grad():
                moved = math.sqrt(
                    sum(
                        float((p - s).pow(2).sum()) for p, s in zip(self.groups[b], self.snap[b], strict=True)
                    )
                )
                size = math.sqrt(sum(float(p.pow(2).sum()) for p in self.groups[b]))
                for p, s in zip(self.groups[b], self.snap[b], strict=True):
                    s.copy_(p)
            updates[b] = moved / max(size * self.lr_sum, 1e-30)
            if self.window <= self.policy.ref:
                self.ref[b] = max(self.ref[b], updates[b])
            if self.prev_update[b]:
                plateaus[b] = abs(updates[b] - self.prev_update[b]) / self.prev_update[b]
            self.prev_update[b] = updates[b]
            if self.policy.signal == "gradnorm":
                if self.prev_grad[b]:
                    rates[b] = abs(self.grad_acc[b] - self.prev_grad[b]) / self.prev_grad[b]
                self.prev_grad[b], self.grad_acc[b] = self.grad_acc[b], 0.0
        self.lr_sum = 0.0
        if self.window > self.policy.ref:
            self._decide(state.global_step, updates, plateaus, rates)

    def _decide(self, step: int, updates: dict, plateaus: dict, rates: dict) -> None:
        if self.policy.signal == "gradnorm":
            if self.frozen < self.limit and self.frozen in rates and len(rates) > 1:
                values = sorted(rates.values())
                if rates[self.frozen] < values[min(len(values) - 1, int(self.policy.tau * len(values)))]:
                    self._freeze_next(step)
            return
        for b in range(self.frozen, self.limit):
            value = (
                updates[b] / max(self.ref[b], 1e-30)
                if self.policy.signal == "update"
                else plateaus.get(b, math.inf)
            )
            self.below[b] = self.below[b] + 1 if value < self.policy.tau else 0
        while self.frozen < self.limit and self.below[self.frozen] >= self.policy.patience:
            self._freeze_next(step)

    def _freeze_next(self, step: int) -> None:
        for p in self.groups[self.frozen]:
            p.requires_grad_(False)
            p.grad = None
        self.frozen_at[self.frozen] = step
        self.frozen += 1
