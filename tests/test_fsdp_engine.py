"""The engine on FSDP2-sharded parameters: two gloo ranks under torchrun with `fully_shard`, on CPU.

tests/programs/fsdp_engine_run.py trains a small MLP through `HybridEngine` with predict phases, once
sharded over two ranks and once in one process with the same global batch (each rank takes half of
it; FSDP averages the gradients). Only the order of float sums differs (the per-rank loss means, the
gradient reduce-scatter, the all-reduced skill sums), so losses agree to ~1e-6 relative and weights to
a few float32 ulps; 1e-5 is far below a step's own loss change, which a differently decided phase or a
differently predicted update would show. Rank 1's shard of the last layer is empty, and the first
layer's 255 rows split 128/127: the uneven cases are in every run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from hf_hybrid.engine.engine import HybridEngine
from hf_hybrid.engine.state import join_state

pytestmark = pytest.mark.distributed

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "programs" / "fsdp_engine_run.py"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
REL_TOL = 1e-5


def _run(cmd: list[str], out: Path, *extra: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(
        [*cmd, str(SCRIPT), "--out", str(out), *extra],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]


def _load(out: Path, scenario: str, rank: int) -> dict[str, Any]:
    return json.loads((out / f"{scenario}_rank{rank}.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Any]:
    sharded, single = tmp_path_factory.mktemp("fsdp"), tmp_path_factory.mktemp("single")
    _run(TORCHRUN, sharded)
    _run([sys.executable], single)
    return {
        "ranks": [_load(sharded, "run", r) for r in (0, 1)],
        "faults": [_load(sharded, "faults", r) for r in (0, 1)],
        "single": _load(single, "run", 0),
        "dir": sharded,
    }


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return abs(a - b) <= REL_TOL * max(abs(a), abs(b))


def test_the_run_is_really_sharded_over_two_ranks(runs):
    rank0, rank1 = runs["ranks"]
    assert [rank0["world_size"], rank1["world_size"]] == [2, 2]
    assert rank0["sharded"] and rank1["sharded"] and not runs["single"]["sharded"]


def test_sharded_run_takes_the_phases_losses_and_weights_of_one_process(runs):
    rank0, rank1 = runs["ranks"]
    single = runs["single"]
    assert rank0["phases"] == rank1["phases"] == single["phases"]
    assert rank0["phases"].count("predict") >= 4 and rank0["stats"]["predict_phases"] >= 2
    assert rank0["losses"] == rank1["losses"]  # all-reduced: the same on every rank
    far = [
        (i, a, b)
        for i, (a, b) in enumerate(zip(rank0["losses"], single["losses"], strict=True))
        if not _close(a, b)
    ]
    assert not far, far[:5]
    assert rank0["weights_sha256"] == rank1["weights_sha256"]
    for name, whole in single["weights"].items():
        gathered = torch.tensor(rank0["weights"][name])
        torch.testing.assert_close(gathered, torch.tensor(whole), rtol=REL_TOL, atol=1e-6)
    counts = ("steps_per_phase", "backward_skipped", "predict_phases", "rollbacks", "refused_updates")
    assert {k: rank0["stats"][k] for k in counts} == {k: single["stats"][k] for k in counts}
    assert rank0["stats"]["predictor_bytes"] < single["stats"]["predictor_bytes"]  # buffers are per shard


def test_resume_from_a_predict_phase_continues_bit_for_bit_on_the_same_world_size(runs):
    assert len(runs["ranks"]) == 2
    for result in runs["ranks"]:
        start = result["saved_at"]
        assert result["saved_phase"] == "predict"
        resumed = result["resumed"]
        assert resumed["phases"] == result["phases"][start:]
        assert resumed["losses"] == result["losses"][start:]
        assert resumed["weights_sha256"] == result["weights_sha256"]
        assert resumed["stats"] == result["stats"]


def _events(runs: dict[str, Any], fault: str) -> list[dict[str, Any]]:
    events = [next(e for e in r["events"] if e["fault"] == fault) for r in runs["faults"]]
    assert events[0]["step"] == events[1]["step"]
    return events


def test_a_predicted_update_non_finite_on_one_shard_is_refused_on_every_rank(runs):
    events = _events(runs, "nan_on_rank1")  # NaN on rank 1's shard only
    assert len(events) == 2
    for event in events:
        assert not event["applied"] and event["unchanged"]
        assert event["reasons"] == ["non-finite predicted delta for 0.weight"]
        assert event["action"] in ("rollback", "force_full")


def test_a_wild_predicted_update_is_clipped_to_the_trust_region_of_the_whole_tensor(runs):
    for event in _events(runs, "wild"):  # 1e6 times the EMA's guess
        assert event["applied"] and not event["unchanged"]
        assert event["within_trust_region"]
    rank0, rank1 = runs["faults"]
    assert rank0["stats"]["clipped_tensors"] == rank1["stats"]["clipped_tensors"] > 0


def test_a_predictor_that_fails_on_one_rank_fails_on_all(runs):
    own, other = _events(runs, "raise_on_rank0")
    assert own["reasons"] == ["the predictor failed (RuntimeError)"]
    assert other["reasons"] == ["the predictor failed on another rank"]
    assert own["action"] == other["action"] and not own["applied"] and not other["applied"]


def test_a_rollback_restores_every_shard_bit_for_bit(runs):
    for event in _events(runs, "spike"):  # a measured loss 1000x inside a predict phase
        assert event["moved_since_snapshot"]  # there was something to undo
        assert event["rolled_back"] and event["restored_snapshot"]
    rank0, rank1 = runs["faults"]
    assert rank0["phases"] == rank1["phases"]
    assert rank0["weights_sha256"] == rank1["weights_sha256"]
    assert rank0["stats"]["rollbacks"] == rank1["stats"]["rollbacks"] >= 1


def test_a_sharded_state_is_refused_on_another_world_size_with_the_restart_escape(runs):
    spec = importlib.util.spec_from_file_location("fsdp_engine_run", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    saved = torch.load(runs["dir"] / "engine_rank0.pt", weights_only=False)
    tree, tensors = saved["engine"]
    state = join_state(json.loads(tree), tensors)
    assert state["sharding"] == {"world_size": 2, "rank": 0}
    model, optimizer = script.build(0)  # one process: whole tensors
    engine = HybridEngine(dict(model.named_parameters()), script.config(0), optimizer=optimizer)
    with pytest.raises(ValueError, match=r"world size of 2, and this run has a world size of 1") as err:
        engine.load_state_dict(state)
    assert "hybrid_restart_engine=True" in str(err.value)


def test_the_adam_replay_reads_the_sharded_optimizer_state_like_the_whole_one(tmp_path):
    """`adam` predicts from the optimizer's exp_avg/exp_avg_sq, which FSDP2 shards like the parameters."""
    sharded, single = tmp_path / "fsdp", tmp_path / "single"
    sharded.mkdir(), single.mkdir()
    _run(TORCHRUN, sharded, "--predictor", "adam", "--no-faults")
    _run([sys.executable], single, "--predictor", "adam")
    rank0, rank1, whole = _load(sharded, "run", 0), _load(sharded, "run", 1), _load(single, "run", 0)
    assert rank0["stats"]["predictor"] == whole["stats"]["predictor"] == "adam"
    assert rank0["phases"] == rank1["phases"] == whole["phases"]
    assert rank0["phases"].count("predict") >= 4
    far = [(a, b) for a, b in zip(rank0["losses"], whole["losses"], strict=True) if not _close(a, b)]
    assert not far, far[:5]
    assert rank0["resumed"]["weights_sha256"] == rank0["weights_sha256"]
