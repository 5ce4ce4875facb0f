"""`freeze:k`: the input side (embeddings) and the bottom k blocks frozen for the whole run, so autograd
stops below them (with peft, the adapters freeze; a head tied to the embedding freezes with it).
"""

from __future__ import annotations

from typing import Any, ClassVar

from torch import nn
from transformers import Trainer

from .base import Method, MethodError, TrialContext
from .blocks import BlocksNotFound, find_blocks, input_side, trainable


class Freeze(Method):
    name: ClassVar[str] = "freeze"
    summary: ClassVar[str] = "embeddings and the bottom k blocks frozen for the whole run (freeze:k)"
    option_help: ClassVar[dict[str, str]] = {"k": "blocks frozen above the embeddings, >= 0"}
    positional: ClassVar[str | None] = "k"
    own_step: ClassVar[bool] = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if "k" not in self.options:
            raise MethodError(f"method {self.spec!r}: give the number of blocks, e.g. freeze:3")
        self.k = self.option("k", int, 0, lambda v: v >= 0, ">= 0")

    def build(self, ctx: TrialContext) -> Trainer:
        model, train, evaluation = ctx.task.build(ctx.seed)
        freeze_bottom(model, self.k)
        return Trainer(args=ctx.training_arguments(), **ctx.trainer_kwargs(model, train, evaluation))

    def check_model(self, model: Any) -> None:
        params_to_freeze(model, self.k)

    def describe_run(self, trainer: Trainer) -> dict[str, Any]:
        params = list(trainer.model.parameters())
        return {
            "trainable_fraction": sum(p.numel() for p in params if p.requires_grad)
            / sum(p.numel() for p in params)
        }


def freeze_bottom(model: nn.Module, k: int) -> None:
    for p in params_to_freeze(model, k):
        p.requires_grad_(False)


def params_to_freeze(model: nn.Module, k: int) -> list[nn.Parameter]:
    """The trainable parameters of the input side and the first `k` blocks, if any are left to train."""
    try:
        name, blocks = find_blocks(model)
    except BlocksNotFound as exc:
        raise MethodError(f"freeze:{k}: {exc}") from None
    if k > len(blocks):
        raise MethodError(
            f"freeze:{k}: {type(model).__name__} has {len(blocks)} blocks; k must be <= {len(blocks)}"
        )
    frozen = trainable([*input_side(model, name), *list(blocks)[:k]])
    chosen = {id(p) for p in frozen}
    if not any(p.requires_grad and id(p) not in chosen for p in model.parameters()):
        raise MethodError(f"freeze:{k}: nothing of {type(model).__name__} would be left to train")
    return frozen
