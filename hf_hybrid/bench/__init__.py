"""`hf-hybrid bench`: the plain Trainer and HybridHFTrainer side by side, at equal quality."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch


def run_bench(
    suite: str = "quick",
    tasks: Sequence[str] | None = None,
    seeds: Sequence[int] | None = None,
    out: str | os.PathLike | None = None,
    hybrid_overrides: dict[str, Any] | None = None,
    echo: Callable[[str], None] = print,
) -> dict[str, Path]:
    """Run a suite, write results.json / report.md / plots to `out`, print the table; return the paths."""
    from transformers.utils import logging as hf_logging

    from .report import write_report
    from .suite import run_suite

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    hf_logging.set_verbosity_error()
    logging.getLogger("hf_hybrid").setLevel(logging.ERROR)
    out = Path(out or f"bench_results/{suite}")
    start = time.perf_counter()
    reports = run_suite(suite, tasks, seeds, hybrid_overrides, progress=echo)
    meta = {
        "suite": suite,
        "command": "hf-hybrid " + " ".join(sys.argv[1:]) if sys.argv[1:2] == ["bench"] else f"bench {suite}",
        "seconds": time.perf_counter() - start,
        "hybrid_overrides": hybrid_overrides or {},
    }
    paths = write_report(reports, out, meta)
    echo(paths["markdown"].read_text())
    echo(f"results: {out}/results.json, report.md, plots")
    return paths
