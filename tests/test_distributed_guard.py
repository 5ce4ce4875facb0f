"""The spike guard on parameters sharded over two gloo ranks (FSDP2's `fully_shard`): the update check
samples each rank's own shards and sums the norms' squares over the ranks, so both ranks judge every
update alike and take an lr burst back shard by shard; their decisions are one process's. Under DDP a
blamed batch's step trains on each rank's own clean batches, every rank alike."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.distributed

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "programs" / "guard_ranks_run.py"
TRAINER_SCRIPT = ROOT / "tests" / "programs" / "distributed_run.py"


def _run(cmd: list[str], out: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out.mkdir()
    done = subprocess.run([*cmd, str(out)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_two_sharded_ranks_take_an_lr_burst_back_alike(tmp_path: Path) -> None:
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    _run([*torchrun, str(SCRIPT), "--sharded"], tmp_path / "sharded")
    _run([sys.executable, str(SCRIPT)], tmp_path / "alone")
    ranks = [json.loads((tmp_path / "sharded" / f"rank{r}.json").read_text()) for r in (0, 1)]
    alone = json.loads((tmp_path / "alone" / "rank0.json").read_text())
    assert ranks[0]["stats"] == ranks[1]["stats"] and ranks[0]["weights"] == ranks[1]["weights"]
    stats = ranks[0]["stats"]
    assert stats["update_check"] and stats["taken_back_steps"] == [41, 42, 43]
    for key in ("taken_back_steps", "update_check_copies", "unjudged_updates", "spike_guard_copy_every"):
        assert stats[key] == alone["stats"][key], key


def test_two_ddp_ranks_train_a_blamed_step_on_their_own_clean_batches_alike(tmp_path: Path) -> None:
    """Random tokens in steps 51-52 on both ranks (each its own): the second is blamed and each rank
    makes the step's gradient from its own batch of step 50, all-reduced as any step's: both ranks
    decide alike and end with the same weights."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    out = tmp_path / "ddp"
    _run([*torchrun, str(TRAINER_SCRIPT), "--max-steps", "60", "--garbage", "50", "--out"], out)
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    decided = [{k: v for k, v in rank["stats"].items() if k != "timing"} for rank in ranks]
    assert ranks[0]["world_size"] == 2 and decided[0] == decided[1]
    assert decided[0]["replay_steps"] == [52]
    assert ranks[0]["params_sha256"] == ranks[1]["params_sha256"]
