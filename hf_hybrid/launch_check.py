"""A launch that asked for several processes and got one, named at run time.

`accelerate launch --cpu --num_processes 2 script.py` (or a `MULTI_CPU` config) starts one process, and
nothing says so: accelerate's simple launcher runs the script once, without `WORLD_SIZE`. What it does
leave in the environment: its `ACCELERATE_*` variables, and `MASTER_ADDR`/`MASTER_PORT`, which it sets only
when it was asked for more than one process (or machine) (`accelerate.utils.launch.
prepare_simple_launcher_cmd_env`, accelerate 1.15). The number asked for is not passed on, so the warning
cannot name it.
"""

from __future__ import annotations

import functools
import logging
import os

logger = logging.getLogger(__name__)

# What starts several processes on a machine without GPUs (measured: docs/scaling.md).
SEVERAL_ON_CPU = (
    "`accelerate launch --multi_gpu --num_processes N script.py` with `use_cpu=True` (`--use_cpu`), or "
    "`torchrun --nproc_per_node N script.py`"
)
_ACCELERATE_LAUNCH = "ACCELERATE_DYNAMO_BACKEND"  # set by every `accelerate launch`, in each process
_WORLD_SIZES = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")


def launched_alone(world_size: int, environ: dict[str, str] | None = None) -> bool:
    """Whether `accelerate launch` was asked for several processes and this one trains alone."""
    env = os.environ if environ is None else environ
    asked_for_several = _ACCELERATE_LAUNCH in env and "MASTER_ADDR" in env
    started = max(int(env.get(name, "1") or 1) for name in _WORLD_SIZES)
    return asked_for_several and started <= 1 and world_size <= 1


def warn_if_launched_alone(world_size: int) -> None:
    """One warning per process (however many trainers it builds) when `launched_alone`."""
    if launched_alone(world_size):
        _warn_once()


@functools.cache
def _warn_once() -> None:
    logger.warning(
        "hf_hybrid: `accelerate launch` was asked for several processes (it set MASTER_ADDR), but it "
        "started this one alone (no WORLD_SIZE): this run trains on one process. `accelerate launch --cpu "
        "--num_processes N` and a MULTI_CPU config start a single process. To train on N processes "
        "without a GPU use %s.",
        SEVERAL_ON_CPU,
    )
