"""hf_hybrid: predictive training for the Hugging Face Trainer.

The public names are imported lazily, so `from hf_hybrid import HybridEngine` (plain PyTorch, reusable on
its own) does not pull in transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .version import __version__

_EXPORTS = {
    "HybridArgumentsMixin": "hf_hybrid.hybrid_arguments",
    "HybridTrainingArguments": "hf_hybrid.args",
    "HybridHFTrainer": "hf_hybrid.trainer",
    "Phase": "hf_hybrid.engine.phases",
    "PhaseSchedule": "hf_hybrid.engine.phases",
    "EngineConfig": "hf_hybrid.engine.config",
    "HybridEngine": "hf_hybrid.engine.engine",
    "StepRecord": "hf_hybrid.engine.engine",
    "StepPlan": "hf_hybrid.engine.engine",
    "StepOutcome": "hf_hybrid.engine.engine",
    "HybridOptimizer": "hf_hybrid.engine.optimizer",
    "DeltaPredictor": "hf_hybrid.engine.predictor",
    "register_predictor": "hf_hybrid.engine.predictor",
    "unregister_predictor": "hf_hybrid.engine.predictor",
    "available_predictors": "hf_hybrid.engine.predictor",
}
__all__ = [
    "DeltaPredictor",
    "EngineConfig",
    "HybridArgumentsMixin",
    "HybridEngine",
    "HybridHFTrainer",
    "HybridOptimizer",
    "HybridTrainingArguments",
    "Phase",
    "PhaseSchedule",
    "StepOutcome",
    "StepPlan",
    "StepRecord",
    "__version__",
    "available_predictors",
    "register_predictor",
    "unregister_predictor",
]

if TYPE_CHECKING:
    from .args import HybridTrainingArguments
    from .engine.config import EngineConfig
    from .engine.engine import HybridEngine, StepOutcome, StepPlan, StepRecord
    from .engine.optimizer import HybridOptimizer
    from .engine.phases import Phase, PhaseSchedule
    from .engine.predictor import (
        DeltaPredictor,
        available_predictors,
        register_predictor,
        unregister_predictor,
    )
    from .hybrid_arguments import HybridArgumentsMixin
    from .trainer import HybridHFTrainer


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'hf_hybrid' has no attribute {name!r}")
