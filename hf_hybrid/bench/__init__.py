"""`hf-hybrid bench`: does a method make *your* fine-tune cheaper at the same quality?

The arena trains your task with the plain `Trainer` (a learning-rate sweep, then its frontier of
complete runs at smaller budgets) and with every method you list, and reads each method's speed-up at
equal eval loss off that frontier, in compute units and in time, with a verdict against the plain runs'
own seed noise. Methods are plug-ins (`hf_hybrid.bench.methods`); tasks are your model and data
(`user_task.py`), a factory of your own, or a built-in preset (`tasks.py`).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from .methods import Method, MethodError, TrialContext, available_methods, parse_method, register_method
from .protocol import Arena, Protocol, parse_methods
from .record import Record
from .report import write_report
from .task import BenchTask

__all__ = [
    "BenchTask",
    "Method",
    "MethodError",
    "Protocol",
    "TrialContext",
    "available_methods",
    "parse_method",
    "register_method",
    "run_arena",
]

SUITES: dict[str, dict] = {
    "tiny": {
        "size": "tiny",
        "tasks": ("clm_stdlib",),
        "seeds": (0,),
        "lr_multipliers": (1.0, 2.0),
        "widen": 0,
    },
    "quick": {
        "size": "quick",
        "tasks": ("clm_stdlib", "minilm_cls", "minilm_lora"),
        "seeds": (0,),
        "lr_multipliers": (0.5, 1.0, 2.0, 4.0),
        "widen": 2,
    },
    "full": {
        "size": "full",
        "tasks": ("clm_stdlib", "minilm_cls", "minilm_lora"),
        "seeds": (0, 1, 2),
        "lr_multipliers": (0.5, 1.0, 2.0, 4.0),
        "widen": 2,
    },
}
DEFAULT_METHODS = ("plain", "hybrid", "null")


def quiet_libraries() -> None:
    """One torch thread (the arena's clock assumes it) and no library chatter between its own lines."""
    from transformers.utils import logging as hf_logging

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()  # "Loading weights" bars at every run's from_pretrained
    logging.getLogger("hf_hybrid").setLevel(logging.ERROR)


def command_line() -> str:
    return "hf-hybrid " + " ".join(sys.argv[1:]) if sys.argv[1:2] == ["bench"] else "run_arena()"


def run_arena(
    task: BenchTask,
    methods: Sequence[str] = DEFAULT_METHODS,
    protocol: Protocol | None = None,
    out: str | os.PathLike = "bench_results/arena",
    echo: Callable[[str], None] = print,
) -> dict[str, Path]:
    """The protocol on one task into `out` (results.json, report.md, arena.png); resumes what is there."""
    protocol = protocol or Protocol()
    parsed, with_nulls = parse_methods(methods)
    protocol.check(task)
    record = Record.open(out, task.describe(), task.identity(), command_line())
    Arena(task, parsed, with_nulls, protocol, record, echo).run()
    paths = write_report(record.data, out)
    echo("\n".join(_summary_lines(record.data)))
    echo(f"results: {paths['json']}, {paths['markdown']}, {paths['plot']}")
    return paths


def _summary_lines(data: dict) -> list[str]:
    from .report import verdict_table

    return ["", f"{data['task'].get('name')}:", *verdict_table(data)]
