"""`hf-hybrid bench`: does a method make *your* fine-tune cheaper at the same quality?

The arena trains your task with the plain `Trainer` and with every method you list, each rate raced by
the same rules on one warmup-stable-decay trunk per rate with a cooldown branch at each smaller budget,
and reads each method's speed-up at equal eval loss at the full budget off plain's frontier, in compute
units and in time, against a band that joins the seeds', the eval set's, the grid's and the price's
noise (`protocol.py`). Methods are plug-ins (`hf_hybrid.bench.methods`); tasks are your model and data
(`user_task.py`), a factory of your own, or a built-in preset (`tasks.py`).

The package's names are imported lazily, so that the protocol's rules (`protocol.py`) can be read without
loading transformers (`hf-hybrid bench --help`).
"""

from __future__ import annotations

import importlib
from typing import Any

_NAMES = {
    "BenchTask": "task",
    "Method": "methods",
    "MethodError": "methods",
    "TrialContext": "methods",
    "available_methods": "methods",
    "parse_method": "methods",
    "register_method": "methods",
    "Protocol": "protocol",
    "quiet_libraries": "runner",
    "run_arena": "run",
    "parse_methods": "arena",
    "SUITES": "run",
    "DEFAULT_METHODS": "run",
}
__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_NAMES[name]}", __name__), name)
