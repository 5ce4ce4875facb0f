"""The arena's methods: one public registry, like the predictor registry.

parse_method("freeze:3")             # a built-in, with its option
parse_method("hybrid:confidence_threshold=0.3,check_every=0")
parse_method("my_pkg.tricks:MyTrainer")   # a Trainer subclass or TrainerCallback by import path
register_method(MyMethod)            # MyMethod.name is then a spec like the built-ins
"""

from __future__ import annotations

from .base import (
    BLIND,
    BRANCHED,
    CONSTANT,
    ENGINE_MS,
    FORWARD,
    SEPARATE_RUNS,
    STEP,
    Method,
    MethodError,
    TrialContext,
)
from .builtin import Hybrid, HybridPredict, NullHybrid, Plain, TrainingArgumentsOverride
from .dropbp import DropBP
from .freeze import Freeze
from .packing import GroupByLength, NaivePacking, Packing
from .peft_lora import PeftAdapters
from .registry import (
    NULL,
    available_methods,
    builtin,
    describe_methods,
    parse_method,
    register_method,
    unregister_method,
)
from .selective_backprop import SelectiveBackprop
from .specs import parse_options

for _method in (
    Plain,
    TrainingArgumentsOverride,
    Hybrid,
    HybridPredict,
    NullHybrid,
    Freeze,
    SelectiveBackprop,
    DropBP,
    PeftAdapters,
    Packing,
    NaivePacking,
    GroupByLength,
):
    builtin(_method)

__all__ = [
    "BLIND",
    "ENGINE_MS",
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
