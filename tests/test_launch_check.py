"""A launch that asked for several processes and got one is named at run time (`launch_check.py`)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hf_hybrid import launch_check
from hf_hybrid.launch_check import SEVERAL_ON_CPU, launched_alone, warn_if_launched_alone

ROOT = Path(__file__).resolve().parents[1]
# What `accelerate launch --cpu --num_processes 2` left in its one process (accelerate 1.15, printed):
ALONE = {
    "ACCELERATE_DYNAMO_BACKEND": "NO",
    "ACCELERATE_MIXED_PRECISION": "no",
    "ACCELERATE_USE_CPU": "True",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29500",
}


def test_several_asked_and_one_started_is_told_apart():
    assert launched_alone(1, ALONE)
    one_asked = {k: v for k, v in ALONE.items() if not k.startswith("MASTER_")}  # --num_processes 1
    assert not launched_alone(1, one_asked)
    assert not launched_alone(1, {"MASTER_ADDR": "10.0.0.1"})  # not accelerate launch: no claim
    assert not launched_alone(1, {**ALONE, "WORLD_SIZE": "2"})  # torchrun / --multi_gpu started them
    assert not launched_alone(1, {**ALONE, "OMPI_COMM_WORLD_SIZE": "2"})  # mpirun (a MULTI_CPU hostfile)
    assert not launched_alone(2, ALONE)  # the Trainer sees several processes


def test_the_warning_is_given_once_and_names_what_starts_several(monkeypatch, caplog):
    monkeypatch.setattr(os, "environ", dict(ALONE))
    launch_check._warn_once.cache_clear()
    with caplog.at_level(logging.WARNING, logger="hf_hybrid.launch_check"):
        warn_if_launched_alone(1)
        warn_if_launched_alone(1)
    launch_check._warn_once.cache_clear()
    (record,) = caplog.records
    assert (
        "--multi_gpu --num_processes N" in record.getMessage()
        and "torchrun --nproc_per_node N" in SEVERAL_ON_CPU
    )
    caplog.clear()
    monkeypatch.setattr(os, "environ", {})
    with caplog.at_level(logging.WARNING, logger="hf_hybrid.launch_check"):
        warn_if_launched_alone(1)
    assert caplog.records == []


@pytest.mark.distributed
def test_accelerate_launch_cpu_with_two_processes_warns(tmp_path):
    """The trap itself: `accelerate launch --cpu --num_processes 2` runs the script once; the library says
    so (once, though the script builds two trainers) and the run trains on one process."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    env = {k: v for k, v in env.items() if k not in ("WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--cpu", "--num_processes", "2"]
    cmd += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    cmd += [str(ROOT / "tests" / "programs" / "launched_alone.py"), "--out", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=240)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert output.count("`accelerate launch` was asked for several processes") == 1, output
    assert "torchrun --nproc_per_node N" in output
    assert output.count("WORLD_SIZE 1") == 1  # one process ran the script
