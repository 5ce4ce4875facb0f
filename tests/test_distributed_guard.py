"""The spike guard's timed decisions agree across ranks: two gloo ranks whose copies and update check
cost differently space the copies and keep or drop the check alike (the dearest rank decides), so a
restore puts every rank back to the same step."""

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


def test_every_rank_spaces_its_copies_and_keeps_its_check_alike(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    done = subprocess.run(
        [*cmd, str(SCRIPT), str(tmp_path)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    decided = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    # rank 0 alone would copy every 10 steps and keep the check; rank 1's costs decide for both
    assert decided[0] == decided[1] == {"copy_every": 40, "update_check": False}, decided
