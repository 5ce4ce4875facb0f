"""The arena's methods: one public registry, like the predictor registry.

    parse_method("freeze:3")             # a built-in, with its option
    parse_method("hybrid:confidence_threshold=0.3,check_every=0")
    parse_method("my_pkg.tricks:MyTrainer")   # a Trainer subclass or TrainerCallback by import path
    register_method(MyMethod)            # MyMethod.name is then a spec like the built-ins

Built-ins: `plain`, `hybrid`, `hybrid-predict`, `null`, `freeze`, `selective-backprop`, `dropbp`, `args`.
"""

from __future__ import annotations

from .base import BLIND, BRANCHED, CONSTANT, FORWARD, SEPARATE_RUNS, STEP, Method, MethodError, TrialContext
from .registry import (
    NULL,
    available_methods,
    describe_methods,
    parse_method,
    parse_options,
    register_method,
    unregister_method,
)

__all__ = [
    "BLIND",
    "BRANCHED",
    "CONSTANT",
    "SEPARATE_RUNS",
    "FORWARD",
    "NULL",
    "STEP",
    "Method",
    "MethodError",
    "TrialContext",
    "available_methods",
    "describe_methods",
    "parse_method",
    "parse_options",
    "register_method",
    "unregister_method",
]
