"""Causal-LM training with HybridHFTrainer, in the style of transformers' `examples/pytorch/run_clm.py`.

The recipe is `hf_hybrid/recipes/clm.py`, which is also `hf-hybrid train`; this file runs it with small,
CPU-sized defaults. Every `TrainingArguments` field and every `hybrid_*` field is a flag (`--help` lists
the main ones, `--help-all` all of them), or all of them come from one .json/.yaml file. With no
arguments it trains a small byte-level GPT-2 from scratch on the Python standard library's source:
offline, a minute or two on CPU.

    python examples/run_clm_hybrid.py
    python examples/run_clm_hybrid.py --model_name_or_path gpt2 --dataset corpus.txt --output_dir out
    python examples/run_clm_hybrid.py args.yaml
    python examples/run_clm_hybrid.py --max_steps 600 --resume_from_checkpoint True   # continue a run
    accelerate launch examples/run_clm_hybrid.py --output_dir run_clm_hybrid_out

`--model_name_or_path` takes a Hub id or a local directory; `--dataset` takes `stdlib`, a local
.txt/.csv/.json/.jsonl file or a Hub dataset name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hf_hybrid.recipes import clm

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
    return clm.main(argv, defaults=DEFAULTS)


if __name__ == "__main__":
    main()
