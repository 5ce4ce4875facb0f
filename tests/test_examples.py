"""Every example runs offline on its defaults (fewer steps)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quickstart_runs_and_reports_its_phases(tmp_path, capsys):
    summary = _load("quickstart").main(max_steps=80, output_dir=str(tmp_path))
    assert summary["steps"] == 80
    assert summary["steps_per_phase"]["warmup"] == 50
    assert sum(summary["steps_per_phase"].values()) == 80
    assert '"eval_loss"' in capsys.readouterr().out
