"""An arena method of your own: a `hf_hybrid.bench.Method` subclass with two kinds of step.

    PYTHONPATH=. hf-hybrid bench --suite tiny --methods plain "examples.arena_method:FreezeAfter:k=1,after=5"

Everything trains for the first `after` steps; from then on the embeddings and the bottom `k` blocks are
frozen, so a step skips their backward. The two kinds cost different amounts, so the arena prices each
by timing a run made only of it (`own_kinds`, `calibration_variant`) and reads how many of each a run
took (`step_counts`). What a step does depends only on its number, never on the run's budget: a branch
resumed from the trunk's checkpoint at any step does what the trunk would have done, so the arena may
branch this method (the default `budget_schedule`). Freezing leaves the optimizer alone: a frozen
parameter's gradient is None, and AdamW skips it.
"""

from __future__ import annotations

from typing import Any, ClassVar

from torch import nn
from transformers import Trainer, TrainerCallback

from hf_hybrid.bench.methods import STEP, Method, TrialContext
from hf_hybrid.bench.methods.freeze import params_to_freeze


class FreezeAfter(Method):
    name: ClassVar[str] = "freeze-after"
    summary: ClassVar[str] = "train everything for `after` steps, then freeze the bottom k blocks"
    option_help: ClassVar[dict[str, str]] = {
        "k": "blocks frozen above the embeddings, >= 0",
        "after": "steps that train everything first, >= 0",
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        self.k = self.option("k", int, 1, lambda v: v >= 0, ">= 0")
        self.after = self.option("after", int, 0, lambda v: v >= 0, ">= 0")

    def check_model(self, model: Any) -> None:
        params_to_freeze(model, self.k)  # refuses a k past the last block, naming the model

    def own_kinds(self) -> tuple[str, ...]:
        return (self.kind("frozen"),)  # a plain step is priced by the arena already (`STEP`)

    def calibration_variant(self, kind: str) -> Method:
        return FreezeAfter(self.spec, {"k": str(self.k), "after": "0"})  # every step frozen

    def step_counts(self, trainer: Trainer, steps: int) -> dict[str, int]:
        return {STEP: min(steps, self.after), self.kind("frozen"): max(0, steps - self.after)}

    def build(self, ctx: TrialContext) -> Trainer:
        model, train, evaluation = ctx.task.build(ctx.seed)
        kwargs = ctx.trainer_kwargs(model, train, evaluation)
        kwargs["callbacks"].append(FreezeAt(params_to_freeze(model, self.k), self.after))
        return Trainer(args=ctx.training_arguments(), **kwargs)


class FreezeAt(TrainerCallback):
    """Freezes `params` once `after` optimizer steps are done, a resumed run at once if it is past them."""

    def __init__(self, params: list[nn.Parameter], after: int) -> None:
        self.params, self.after = params, after

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step >= self.after and any(p.requires_grad for p in self.params):
            for p in self.params:
                p.requires_grad_(False)
                p.grad = None
