"""examples/plain_pytorch_loop.py: the engine in a plain PyTorch loop, without transformers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "plain_pytorch_loop.py"
PROBE = """
import runpy, sys
sys.argv = ["plain_pytorch_loop.py", "--steps", "150"]
runpy.run_path(sys.argv_path, run_name="__main__")
assert "transformers" not in sys.modules, "the plain loop imported transformers"
"""


def test_plain_loop_skips_backward_passes_without_transformers():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    code = PROBE.replace("sys.argv_path", repr(str(EXAMPLE)))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    phases = result["steps_per_phase"]
    assert result["steps"] == 150 == sum(phases.values())
    assert phases["warmup"] == 30 and phases["predict"] > 0 and phases["correct"] > 0
    assert result["backward_skipped"] == phases["predict"]
    assert result["final_loss"] < 1.0  # it trained: the loss of the untrained model is 15.4
