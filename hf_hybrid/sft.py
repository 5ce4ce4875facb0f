"""TRL integration: `HybridSFTConfig` and `HybridSFTTrainer` (needs `pip install trl`).

The resolution order HybridSFTTrainer -> HybridHFTrainer -> SFTTrainer -> Trainer works because every
HybridHFTrainer override calls `super()`: SFTTrainer's own training_step, compute_loss and log run inside
the hybrid step. `peft_config` is applied by HybridHFTrainer (get_peft_model on the loaded model), not by
TRL, so TRL's handling of added chat-template tokens under peft is skipped: pass a loaded model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trl import SFTConfig, SFTTrainer

from .args import HybridArgumentsMixin
from .trainer import HybridHFTrainer


@dataclass
class HybridSFTConfig(HybridArgumentsMixin, SFTConfig):
    """`trl.SFTConfig` plus the `hybrid_*` fields, validated in `__post_init__` like the rest."""


class HybridSFTTrainer(HybridHFTrainer, SFTTrainer):
    """`trl.SFTTrainer` whose optimizer steps go through the hybrid phase machine.

    Any `TrainingArguments` (an `SFTConfig`, `HybridTrainingArguments`, ...) is upcast to `HybridSFTConfig`,
    keeping its values; otherwise HybridHFTrainer would upcast an SFTConfig to HybridTrainingArguments and
    SFTTrainer could not rebuild its config from it.
    """

    def __init__(self, model: Any, args: Any = None, *more: Any, **kwargs: Any) -> None:
        if isinstance(model, str) and kwargs.get("peft_config") is not None:
            raise ValueError(
                "HybridSFTTrainer: with `peft_config`, pass a loaded model, not the name "
                f"{model!r} (load it with AutoModelForCausalLM.from_pretrained first)"
            )
        super().__init__(model, as_hybrid_sft_config(args), *more, **kwargs)


def as_hybrid_sft_config(args: Any) -> HybridSFTConfig:
    """Upcast any TrainingArguments (or None) to HybridSFTConfig, keeping its values."""
    if isinstance(args, HybridSFTConfig):
        return args
    if args is None:
        return HybridSFTConfig()
    values = args.to_dict()
    values["hub_token"] = args.hub_token  # to_dict() masks tokens
    return HybridSFTConfig(**values)
