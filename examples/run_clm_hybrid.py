"""Causal-LM training with HybridHFTrainer, in the style of transformers' `examples/pytorch/run_clm.py`.

Every `TrainingArguments` field and every `hybrid_*` field is a flag (`--help` lists them), or all of
them come from one .json/.yaml file. With no arguments it trains a small byte-level GPT-2 from scratch
on the Python standard library's source: offline, a minute or two on CPU.

    python examples/run_clm_hybrid.py
    python examples/run_clm_hybrid.py --model_name_or_path gpt2 --dataset corpus.txt --output_dir out
    python examples/run_clm_hybrid.py args.yaml
    python examples/run_clm_hybrid.py --max_steps 600 --resume_from_checkpoint True   # continue a run
    accelerate launch examples/run_clm_hybrid.py --output_dir run_clm_hybrid_out

`--model_name_or_path` takes a Hub id or a local directory; `--dataset` takes `stdlib`, a local
.txt/.json/.jsonl file or a Hub dataset name (see `hf-hybrid train --help`, which shares these arguments).
"""

from __future__ import annotations

import json
import logging
import math
import sys
from collections.abc import Sequence
from typing import Any

import transformers
from transformers import default_data_collator, set_seed

from hf_hybrid import HybridHFTrainer, HybridTrainingArguments
from hf_hybrid.cli import (
    DataArguments,
    ModelArguments,
    load_lm_datasets,
    load_model_and_tokenizer,
    parse_arguments,
    resolve_block_size,
    resume_target,
)

logger = logging.getLogger(__name__)

# Small, CPU-sized defaults; any flag or argument-file entry overrides them.
DEFAULTS: dict[str, Any] = {
    "output_dir": "run_clm_hybrid_out",
    "max_steps": 300,
    "per_device_train_batch_size": 16,
    "per_device_eval_batch_size": 16,
    "learning_rate": 1e-3,
    "logging_steps": 50,
    "save_steps": 100,
    "report_to": "none",
    "max_train_samples": 2048,
    "max_eval_samples": 64,
    "hybrid_warmup_steps": 50,
    "hybrid_full_steps": 10,
    "hybrid_confidence_threshold": 0.3,
}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    model_args, data_args, training_args = parse_arguments(
        (ModelArguments, DataArguments, HybridTrainingArguments), argv, defaults=DEFAULTS
    )
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logger.setLevel(training_args.get_process_log_level())
    transformers.utils.logging.set_verbosity(training_args.get_process_log_level())
    set_seed(training_args.seed)

    model, tokenizer = load_model_and_tokenizer(model_args)
    block_size = resolve_block_size(data_args, model)
    train_dataset, eval_dataset = load_lm_datasets(data_args, tokenizer, block_size)

    trainer = HybridHFTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        data_collator=default_data_collator,
    )

    result = trainer.train(resume_from_checkpoint=resume_target(training_args.resume_from_checkpoint))
    trainer.save_model()  # the model, its config and the tokenizer
    train_metrics = {**result.metrics, "train_samples": len(train_dataset)}
    trainer.log_metrics("train", train_metrics)
    trainer.save_metrics("train", train_metrics)
    trainer.save_state()

    eval_metrics = trainer.evaluate()
    eval_metrics["eval_samples"] = len(eval_dataset)
    try:
        eval_metrics["perplexity"] = math.exp(eval_metrics["eval_loss"])
    except OverflowError:
        eval_metrics["perplexity"] = math.inf
    trainer.log_metrics("eval", eval_metrics)
    trainer.save_metrics("eval", eval_metrics)

    card = {"tasks": "text-generation", "dataset": data_args.dataset}
    if model_args.model_name_or_path is not None:
        card["finetuned_from"] = model_args.model_name_or_path
    if training_args.push_to_hub:
        trainer.push_to_hub(**card)
    else:
        trainer.create_model_card(**card)

    summary = {"train": train_metrics, "eval": eval_metrics, "hybrid": trainer.hybrid_stats()}
    if trainer.is_world_process_zero():
        print(json.dumps(summary["hybrid"], indent=2))
    return summary


if __name__ == "__main__":
    main()
