"""hf_hybrid: predictive training for the Hugging Face Trainer.

The public names are imported lazily, so `import hf_hybrid.engine` (plain PyTorch, reusable on its
own) does not pull in transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "HybridArgumentsMixin": "hf_hybrid.args",
    "HybridTrainingArguments": "hf_hybrid.args",
    "HybridHFTrainer": "hf_hybrid.trainer",
    "Phase": "hf_hybrid.engine.phases",
}
__all__ = ["HybridArgumentsMixin", "HybridHFTrainer", "HybridTrainingArguments", "Phase"]

if TYPE_CHECKING:
    from .args import HybridArgumentsMixin, HybridTrainingArguments
    from .engine.phases import Phase
    from .trainer import HybridHFTrainer


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'hf_hybrid' has no attribute {name!r}")
