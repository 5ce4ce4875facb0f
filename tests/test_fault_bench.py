"""`hf-hybrid bench --faults`: every arm clean and faulted, resumable, a table; the faults as injected."""

from __future__ import annotations

import json

import pytest
import torch

from hf_hybrid.bench.measure.faults import FaultWindow, corrupt, fault_table, fault_window
from hf_hybrid.cli import main


def test_the_fault_bench_runs_every_arm_clean_and_faulted_and_resumes(tmp_path, capsys):
    argv = ["bench", "--faults", "garbage", "--suite", "tiny", "--seeds", "0", "--max_steps", "30"]
    argv += ["--out", str(tmp_path)]
    assert main(argv) == 0
    record = json.loads((tmp_path / "clm_stdlib" / "faults.json").read_text())
    runs = {(r["arm"], r["fault"]) for r in record["runs"]}
    assert runs == {
        (arm, fault) for arm in ("plain", "hybrid:spike_guard=on") for fault in ("clean", "garbage")
    }
    guarded = [r for r in record["runs"] if r["arm"] == "hybrid:spike_guard=on"]
    assert all(r["spike_guard_bytes"] > 0 and "restores" in r for r in guarded)
    assert all(r["spike_guard_bytes"] == 0 for r in record["runs"] if r["arm"] == "plain")
    table = (tmp_path / "clm_stdlib" / "faults.md").read_text()
    assert table == fault_table(record) + "\n" and "| garbage | `plain` |" in table
    capsys.readouterr()
    assert main(argv) == 0  # everything is in the record: nothing runs again
    assert "eval loss" not in capsys.readouterr().out.split("| fault |")[0]
    assert len(json.loads((tmp_path / "clm_stdlib" / "faults.json").read_text())["runs"]) == 4


def test_an_unknown_fault_is_refused_naming_the_known_ones(tmp_path, capsys):
    argv = ["bench", "--faults", "meteor", "--suite", "tiny", "--seeds", "0", "--out", str(tmp_path)]
    assert main(argv) == 2
    assert (
        "unknown fault 'meteor'; faults: ['lr_burst', 'garbage', 'shuffled_labels']"
        in capsys.readouterr().err
    )


def test_the_fault_window_is_mid_run_and_the_corruptions_change_what_they_say():
    assert fault_window("lr_burst", 100) == FaultWindow("lr_burst", 50, 3)
    window = fault_window("shuffled_labels", 40)
    assert [window.covers(s) for s in (19, 20, 24, 25)] == [False, True, True, False]
    ids = torch.arange(12).reshape(4, 3)
    batch = {"input_ids": ids, "labels": torch.tensor([0, 1, 2, 3])}
    shuffled = corrupt(batch, "shuffled_labels", torch.Generator().manual_seed(0), vocab=50)
    assert torch.equal(shuffled["input_ids"], ids) and torch.equal(
        batch["labels"], torch.tensor([0, 1, 2, 3])
    )
    assert sorted(shuffled["labels"].tolist()) == [0, 1, 2, 3]
    assert all(a != b for a, b in zip(shuffled["labels"].tolist(), [0, 1, 2, 3], strict=True))
    lm = {"input_ids": ids, "labels": ids.clone()}
    garbage = corrupt(lm, "garbage", torch.Generator().manual_seed(0), vocab=50)
    assert not torch.equal(garbage["input_ids"], ids) and torch.equal(garbage["labels"], garbage["input_ids"])
    with pytest.raises(ValueError, match="unknown fault"):
        fault_window("meteor", 10)
