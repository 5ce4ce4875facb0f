"""Tiny models, data and run helpers shared by the trainer tests."""

from __future__ import annotations

from typing import Any

import torch
from datasets import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from hf_hybrid import HybridHFTrainer, HybridTrainingArguments
from hf_hybrid.data import stdlib_lm_datasets

BLOCK = 32
_DATA: dict[str, tuple[Dataset, Dataset]] = {}


def tiny_data() -> tuple[Dataset, Dataset]:
    if "stdlib" not in _DATA:
        _DATA["stdlib"] = stdlib_lm_datasets(block_size=BLOCK, train_blocks=512, eval_blocks=32)
    return _DATA["stdlib"]


def tiny_gpt2(seed: int = 0) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=256, n_positions=BLOCK, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0
    )
    return GPT2LMHeadModel(config)


def common_args(tmp_path: Any, **overrides: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "output_dir": str(tmp_path),
        "max_steps": 40,
        "per_device_train_batch_size": 8,
        "learning_rate": 3e-3,
        "logging_steps": 1,
        "report_to": "none",
        "save_strategy": "no",
        "use_cpu": True,
        "seed": 0,
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
    }
    args.update(overrides)
    return args


def hybrid_args(tmp_path: Any, **overrides: Any) -> HybridTrainingArguments:
    defaults = {
        "hybrid_warmup_steps": 10,
        "hybrid_full_steps": 3,
        "hybrid_confidence_threshold": 0.0,
        "hybrid_min_history": 4,
        "hybrid_max_predict_steps": 4,
    }
    defaults.update(overrides)
    return HybridTrainingArguments(**common_args(tmp_path, **defaults))


def plain_trainer(tmp_path: Any, model: torch.nn.Module | None = None, **overrides: Any) -> Trainer:
    train, _ = tiny_data()
    return Trainer(
        model=model or tiny_gpt2(),
        args=TrainingArguments(**common_args(tmp_path, **overrides)),
        train_dataset=train,
    )


def hybrid_trainer(tmp_path: Any, model: torch.nn.Module | None = None, **overrides: Any) -> HybridHFTrainer:
    train, evaluation = tiny_data()
    return HybridHFTrainer(
        model=model or tiny_gpt2(),
        args=hybrid_args(tmp_path, **overrides),
        train_dataset=train,
        eval_dataset=evaluation,
    )


def step_logs(trainer: Trainer, key: str) -> list[float]:
    return [
        entry[key] for entry in trainer.state.log_history if key in entry and "train_runtime" not in entry
    ]


class EveryStep(TrainerCallback):
    """Calls `fn(trainer)` at the end of every optimizer step."""

    def __init__(self, trainer: Trainer, fn: Any) -> None:
        self.trainer = trainer
        self.fn = fn

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.fn(self.trainer)


def lora_gpt2(rank: int = 4, seed: int = 0) -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=rank, lora_alpha=2 * rank, target_modules=["c_attn"], fan_in_fan_out=True, task_type="CAUSAL_LM"
    )
    model = get_peft_model(tiny_gpt2(seed), config)
    torch.manual_seed(seed)
    return model


class SaveAt(TrainerCallback):
    """Save a checkpoint right after the first step of each wanted kind."""

    def __init__(self, trainer, wanted=("mid_predict", "correct")):
        self.trainer = trainer
        self.pending = set(wanted)
        self.saved: dict[str, int] = {}

    def on_step_end(self, args, state, control, **kwargs):
        engine = self.trainer.engine
        phase = self.trainer.hybrid_timeline[-1]["phase"]
        kind = None
        if phase == "predict" and engine.controller.predict_remaining > 0:
            kind = "mid_predict"
        elif phase == "correct":
            kind = "correct"
        if kind in self.pending:
            self.pending.discard(kind)
            self.saved[kind] = state.global_step
            control.should_save = True


def counters(stats: dict[str, Any]) -> dict[str, Any]:
    """`hybrid_stats()` without its `timing` entry, the one part that differs from run to run."""
    return {key: value for key, value in stats.items() if key != "timing"}
