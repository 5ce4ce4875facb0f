"""Training recipes: each module is both a task of `hf-hybrid train` and the library of an example.

As TRL's `trl/scripts/sft.py` is both the `trl sft` command and its example, `clm.py` is
`hf-hybrid train` (`--task causal_lm`, the default) and `examples/run_clm_hybrid.py`, and
`classification.py` is `hf-hybrid train --task sequence_classification` and
`examples/run_classification_hybrid.py`; the examples only add CPU-sized defaults. `common.py` holds
what every script shares: argument parsing, logging and seed, the resume target and `finish()`.
None of these modules imports transformers or torch when imported, so `--help` answers at once.
"""

from __future__ import annotations

TASKS = {
    "causal_lm": "hf_hybrid.recipes.clm",
    "sequence_classification": "hf_hybrid.recipes.classification",
}
DEFAULT_TASK = "causal_lm"
