"""`dropbp:p=0.5`: each block's backward skipped with probability p per optimizer step (Woo et al.,
"DropBP", NeurIPS 2024). A dropped block runs under `no_grad` and returns `x + stopgrad(block(x) - x)`: the
gradient passes by the residual alone. Draws are per optimizer step, seeded by the run's seed.
"""

from __future__ import annotations

import os
import types
from typing import Any, ClassVar

import torch
from torch import nn
from transformers import Trainer, TrainerCallback

from .base import Method, MethodError, TrialContext
from .blocks import BlocksNotFound, find_blocks

STATE_FILE = "dropbp_state.pt"


class DropBP(Method):
    name: ClassVar[str] = "dropbp"
    summary: ClassVar[str] = "each block's backward skipped with probability p per step (dropbp:p=0.5)"
    option_help: ClassVar[dict[str, str]] = {"p": "probability of skipping a block's backward, in [0, 1)"}
    positional: ClassVar[str | None] = "p"
    own_step: ClassVar[bool] = True

    def __post_init__(self) -> None:
        super().__post_init__()
        self.p = self.option("p", float, 0.5, lambda v: 0.0 <= v < 1.0, "in [0, 1)")

    def check_model(self, model: Any) -> None:
        _blocks(model, self.spec)

    def build(self, ctx: TrialContext) -> Trainer:
        model, train, evaluation = ctx.task.build(ctx.seed)
        dropper = BlockDropper(_blocks(model, self.spec), self.p, ctx.seed)
        if ctx.resume_from is not None:
            dropper.load(ctx.resume_from)
        kwargs = ctx.trainer_kwargs(model, train, evaluation)
        kwargs["callbacks"] = [*kwargs["callbacks"], dropper]
        return Trainer(args=ctx.training_arguments(), **kwargs)


def _blocks(model: nn.Module, spec: str) -> nn.ModuleList:
    try:
        return find_blocks(model)[1]
    except BlocksNotFound as exc:
        raise MethodError(f"method {spec!r}: {exc}") from None


class BlockDropper(TrainerCallback):
    """Wraps each block's forward; `draw()`, as each step begins, picks the blocks whose backward it skips."""

    def __init__(self, blocks: nn.ModuleList, p: float, seed: int) -> None:
        self.p = p
        self.generator = torch.Generator().manual_seed(seed)
        self.dropped = [False] * len(blocks)
        self.skipped = 0
        for index, block in enumerate(blocks):
            block.forward = types.MethodType(_dropping_forward(block.forward, self, index), block)

    def draw(self) -> None:
        """A fresh draw; never every block (with nothing trainable below them, no gradient at all)."""
        mask = torch.rand(len(self.dropped), generator=self.generator) < self.p
        if bool(mask.all()):
            mask[-1] = False
        self.dropped = mask.tolist()
        self.skipped += int(mask.sum())

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state(), "skipped": self.skipped}

    def load(self, checkpoint: str) -> None:
        """Continue the draws of the run saved in `checkpoint`."""
        state = torch.load(os.path.join(checkpoint, STATE_FILE), weights_only=True)
        self.generator.set_state(state["generator"])
        self.skipped = int(state["skipped"])

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.draw()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        torch.save(self.state_dict(), os.path.join(folder, STATE_FILE))


def _dropping_forward(forward: Any, dropper: BlockDropper, index: int) -> Any:
    def wrapped(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        if not (dropper.dropped[index] and self.training and torch.is_grad_enabled()):
            return forward(*args, **kwargs)
        x = args[0] if args else kwargs["hidden_states"]
        with torch.no_grad():
            out = forward(*args, **kwargs)
        if isinstance(out, tuple):
            return (x + (out[0] - x).detach(), *out[1:])
        return x + (out - x).detach()

    return wrapped
