"""`run_arena`: the protocol on one task into one record, and the built-in suites."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from .arena import Arena, parse_methods
from .executors import make_executor
from .protocol import FIRST_RATES, MAX_WIDENINGS, Protocol
from .record import Record
from .report import verdict_table, write_report
from .task import BenchTask

_PRESETS = ("clm_stdlib", "minilm_cls", "minilm_lora")
SUITES: dict[str, dict] = {
    "tiny": dict(size="tiny", tasks=("clm_stdlib",), seeds=(0,), lr_multipliers=(1.0, 2.0), widen=1),
    "quick": dict(size="quick", tasks=_PRESETS, seeds=(0,), lr_multipliers=FIRST_RATES, widen=MAX_WIDENINGS),
    "full": dict(
        size="full", tasks=_PRESETS, seeds=(0, 1, 2), lr_multipliers=FIRST_RATES, widen=MAX_WIDENINGS
    ),
}
DEFAULT_METHODS = ("plain", "hybrid", "null")


def command_line() -> str:
    return "hf-hybrid " + " ".join(sys.argv[1:]) if sys.argv[1:2] == ["bench"] else "run_arena()"


def run_arena(
    task: BenchTask,
    methods: Sequence[str] = DEFAULT_METHODS,
    protocol: Protocol | None = None,
    out: str | os.PathLike = "bench_results/arena",
    echo: Callable[[str], None] = print,
    workers: int | None = None,
    ray: str | None = None,
    use_ray: bool = False,
    fresh: bool = False,
) -> dict[str, Path]:
    """The protocol on one task into `out` (results.json, report.md, arena.png); resumes what is there.
    `workers`: that many local processes; `use_ray`: Ray tasks on the cluster at `ray` (None: the session
    this process has, `local`: one started here)."""
    protocol = protocol or Protocol()
    parsed, with_nulls = parse_methods(methods)
    record = Record.open(out, task.describe(), task.identity(), command_line(), fresh=fresh)
    arena = Arena(task, parsed, with_nulls, protocol, record, echo=echo)
    arena.executor = make_executor(task, workers, ray, use_ray)
    arena.check()
    _write_labels(task, out)
    try:
        arena.run()
    except KeyboardInterrupt:  # stopped by hand: what it has so far, drawn, before it goes
        paths = write_report(record.data, out)
        echo(f"stopped; the report so far: {paths['markdown']}, {paths['plot']} (the same command resumes)")
        raise
    paths = write_report(record.data, out)
    echo("\n".join(_summary_lines(record.data)))
    echo(f"results: {paths['json']}, {paths['markdown']}, {paths['plot']}")
    return paths


def _write_labels(task: BenchTask, out: str | os.PathLike) -> None:
    """A classification task's label names, beside the record (once every input has been accepted)."""
    names = task.info.get("labels")
    if names:
        path = Path(out)
        path.mkdir(parents=True, exist_ok=True)
        (path / "labels.json").write_text(json.dumps({"id2label": dict(enumerate(names))}, indent=1) + "\n")


def _summary_lines(data: dict) -> list[str]:
    return ["", f"{data['task'].get('name')}:", *verdict_table(data)]
