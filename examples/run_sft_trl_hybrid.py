"""TRL's `SFTTrainer` with the hybrid phase machine, through `hf_hybrid.sft`:

    HybridSFTConfig  = HybridArgumentsMixin + trl.SFTConfig   (every SFT field and every hybrid_* field)
    HybridSFTTrainer = HybridHFTrainer + trl.SFTTrainer       (SFT's data handling and loss, hybrid steps)

The method resolution order is HybridSFTTrainer -> HybridHFTrainer -> SFTTrainer -> TRL's base trainer
-> Trainer. Every HybridHFTrainer override calls `super()`, so SFTTrainer's `training_step`,
`compute_loss` (completion-only loss, token accuracy), `log` and model card run inside the hybrid step.
`peft_config=` works as with SFTTrainer for a loaded model (HybridHFTrainer wraps it with peft first).

The task: prompt-completion pairs from the Python standard library (prompt: a function's one-line
docstring summary; completion: the function's source), built offline. With no `--model_name_or_path`
a tiny byte-level GPT-2 is trained from scratch so the example runs anywhere; pass a Hub id or a local
directory of a causal LM for a real fine-tune (and `--bf16 true --gradient_checkpointing true` on a GPU:
the defaults here are CPU-sized).

    python examples/run_sft_trl_hybrid.py
    python examples/run_sft_trl_hybrid.py --model_name_or_path Qwen/Qwen2.5-0.5B --max_length 512 --bf16 true
    python examples/run_sft_trl_hybrid.py args.yaml
    accelerate launch examples/run_sft_trl_hybrid.py --output_dir run_sft_trl_hybrid_out
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2Config, GPT2LMHeadModel

from hf_hybrid.data import is_eval_file, stdlib_source_files
from hf_hybrid.recipes.common import parse_arguments, setup_run, train_and_finish
from hf_hybrid.sft import HybridSFTConfig, HybridSFTTrainer

BYTE_EOS = "<|endoftext|>"

# CPU-sized defaults. SFTConfig's own defaults (bf16, gradient checkpointing) suit GPUs, not CPUs.
DEFAULTS: dict[str, Any] = {
    "output_dir": "run_sft_trl_hybrid_out",
    "max_steps": 200,
    "per_device_train_batch_size": 16,
    "per_device_eval_batch_size": 16,
    "learning_rate": 1e-3,
    "logging_steps": 20,
    "save_steps": 100,
    "max_length": 128,
    "bf16": False,
    "gradient_checkpointing": False,
    "report_to": "none",
    "hybrid_warmup_steps": 40,
    "hybrid_full_steps": 10,
    "hybrid_confidence_threshold": 0.3,
}


@dataclass
class ModelArguments:
    model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "Hub id or local directory of a causal LM (with its tokenizer). Default: a tiny "
            "byte-level GPT-2 (2 layers x 64) trained from scratch."
        },
    )


@dataclass
class DataArguments:
    max_train_samples: int = field(default=2048, metadata={"help": "Training pairs (at most)."})
    max_eval_samples: int = field(default=64, metadata={"help": "Evaluation pairs (at most)."})

    def __post_init__(self) -> None:
        for name in ("max_train_samples", "max_eval_samples"):
            if getattr(self, name) < 1:
                raise ValueError(f"`{name}` must be >= 1, got {getattr(self, name)}")


def stdlib_docstring_pairs(max_train: int, max_eval: int) -> tuple[Dataset, Dataset]:
    """Prompt: `# <docstring summary>`; completion: the function's source. Eval pairs: other files."""
    pairs: dict[bool, list[dict[str, str]]] = {False: [], True: []}
    for path in stdlib_source_files():
        held_out = is_eval_file(path, 10)
        if len(pairs[held_out]) >= (max_eval if held_out else max_train):
            if len(pairs[False]) >= max_train and len(pairs[True]) >= max_eval:
                break
            continue
        source = path.read_text(encoding="utf-8", errors="replace")
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        lines = source.splitlines(keepends=True)
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            summary = (ast.get_docstring(node) or "").strip().split("\n")[0]
            if 10 <= len(summary) <= 100:
                code = textwrap.dedent("".join(lines[node.lineno - 1 : node.end_lineno]))
                pairs[held_out].append({"prompt": f"# {summary}\n", "completion": code})
    return Dataset.from_list(pairs[False][:max_train]), Dataset.from_list(pairs[True][:max_eval])


def byte_level_tokenizer() -> Any:
    """Bytes as tokens (256) plus an end-of-text token; needs no download and no training."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {char: i for i, char in enumerate(alphabet)}
    vocab[BYTE_EOS] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=BYTE_EOS, pad_token=BYTE_EOS)


def load_model_and_tokenizer(model_args: ModelArguments, max_length: int | None) -> tuple[Any, Any]:
    if model_args.model_name_or_path is not None:
        tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path)
        return AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path), tokenizer
    tokenizer = byte_level_tokenizer()
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=max_length or 128,
        n_embd=64,
        n_layer=2,
        n_head=2,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return GPT2LMHeadModel(config), tokenizer


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    model_args, data_args, training_args = parse_arguments(
        (ModelArguments, DataArguments), argv, defaults=DEFAULTS, training_arguments=HybridSFTConfig
    )
    setup_run(training_args)
    model, tokenizer = load_model_and_tokenizer(model_args, training_args.max_length)
    train_dataset, eval_dataset = stdlib_docstring_pairs(
        data_args.max_train_samples, data_args.max_eval_samples
    )
    trainer = HybridSFTTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
    )
    # TRL's card names the base model itself (a Hub id); `dataset_name` is what it can be told.
    return train_and_finish(trainer, {"dataset_name": "stdlib docstring -> function pairs"})


if __name__ == "__main__":
    main()
