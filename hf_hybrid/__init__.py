"""hf_hybrid: predictive training for the Hugging Face Trainer."""

from .args import HybridArgumentsMixin, HybridTrainingArguments
from .engine.phases import Phase
from .trainer import HybridHFTrainer

__all__ = ["HybridArgumentsMixin", "HybridHFTrainer", "HybridTrainingArguments", "Phase"]
__version__ = "0.1.0"
