"""Training recipes: each module is both a task of `hf-hybrid train` and the library of an example.

As TRL's `trl/scripts/sft.py` is both `trl sft` and its example (the examples only add CPU-sized
defaults). None of these modules imports transformers or torch when imported, so `--help` answers at once.
"""

from __future__ import annotations

TASKS = {"causal_lm": "hf_hybrid.recipes.clm", "sequence_classification": "hf_hybrid.recipes.classification"}
DEFAULT_TASK = "causal_lm"
