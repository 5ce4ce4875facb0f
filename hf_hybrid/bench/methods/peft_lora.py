"""`peft:lora`: the task's model with rank-`r` LoRA adapters (peft's default modules, or `targets`) against
its full fine-tune; its race centred at `ADAPTER_RATE_SCALE` x plain's rate (LoRA's rates are higher).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from peft import LoraConfig, TaskType, get_peft_model
from transformers import Trainer

from ..protocol import ADAPTER_RATE_SCALE
from .base import Method, MethodError, TrialContext

KINDS = ("lora",)


class PeftAdapters(Method):
    name: ClassVar[str] = "peft"
    summary: ClassVar[str] = "the task's model with LoRA adapters instead of a full fine-tune (peft:lora,r=8)"
    option_help: ClassVar[dict[str, str]] = {
        "kind": "the adapter: lora",
        "r": "rank, >= 1 (default 8)",
        "alpha": "scaling, > 0 (default 2r)",
        "targets": "module names joined by + (default: peft's for the architecture)",
    }
    positional: ClassVar[str | None] = "kind"
    rate_scale: ClassVar[float] = ADAPTER_RATE_SCALE  # adapters train at about ten times the rate
    own_step: ClassVar[bool] = True

    def __post_init__(self) -> None:
        super().__post_init__()
        self.adapter = self.option("kind", str, "lora", lambda v: v in KINDS, f"one of {list(KINDS)}")
        self.r = self.option("r", int, 8, lambda v: v >= 1, ">= 1")
        self.alpha = self.option("alpha", float, 2.0 * self.r, lambda v: v > 0, "> 0")
        targets = self.options.get("targets")
        self.targets = targets.split("+") if targets else None

    def check_model(self, model: Any) -> None:
        if hasattr(model, "peft_config"):
            raise MethodError(f"method {self.spec!r}: the task's model already trains adapters")

    def build(self, ctx: TrialContext) -> Trainer:
        model, train, evaluation = ctx.task.build(ctx.seed)
        task_type = TaskType.CAUSAL_LM if ctx.task.task_type == "causal_lm" else TaskType.SEQ_CLS
        config = LoraConfig(task_type=task_type, r=self.r, lora_alpha=self.alpha, target_modules=self.targets)
        torch.manual_seed(ctx.seed)
        try:
            model = get_peft_model(model, config)
        except ValueError as exc:
            raise MethodError(f"method {self.spec!r}: {exc}; name the modules with targets=a+b") from None
        return Trainer(args=ctx.training_arguments(), **ctx.trainer_kwargs(model, train, evaluation))

    def describe_run(self, trainer: Trainer) -> dict[str, Any]:
        params = list(trainer.model.parameters())
        trainable = sum(p.numel() for p in params if p.requires_grad)
        return {"trainable_fraction": trainable / sum(p.numel() for p in params)}
