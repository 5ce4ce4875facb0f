"""The smallest HybridHFTrainer run: a byte-level GPT-2 on the Python standard library, offline.

python examples/quickstart.py                       # one process
accelerate launch examples/quickstart.py            # as many processes as `accelerate config` says
"""

from __future__ import annotations

import json

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from hf_hybrid import HybridHFTrainer, HybridTrainingArguments
from hf_hybrid.data import BYTE_VOCAB_SIZE, stdlib_lm_datasets


def main(max_steps: int = 300, output_dir: str = "quickstart_out") -> dict:
    train, evaluation = stdlib_lm_datasets(block_size=128, train_blocks=2048, eval_blocks=64)
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=BYTE_VOCAB_SIZE, n_positions=128, n_embd=64, n_layer=2, n_head=2)
    model = GPT2LMHeadModel(config)
    args = HybridTrainingArguments(
        output_dir=output_dir,
        max_steps=max_steps,
        per_device_train_batch_size=16,
        learning_rate=1e-3,
        logging_steps=50,
        report_to="none",
        hybrid_warmup_steps=50,
        hybrid_full_steps=10,
        hybrid_confidence_threshold=0.3,
    )
    trainer = HybridHFTrainer(model=model, args=args, train_dataset=train, eval_dataset=evaluation)
    trainer.train()
    summary = {"eval_loss": trainer.evaluate()["eval_loss"], **trainer.hybrid_stats()}
    print(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
