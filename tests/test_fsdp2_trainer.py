"""HybridHFTrainer under accelerate's FSDP2, two gloo ranks on CPU, against one process.

accelerate refuses FSDP on CPU, so tests/programs/fsdp2_cpu_shim.py forces its FSDP2 path (test-only;
see its docstring): `prepare` then applies `fully_shard` and every trainable parameter is a DTensor
sharded on dim 0, as on GPUs. tests/programs/fsdp2_trainer_run.py trains a GPT-2 (2 x 64) with predict
phases on two ranks (4 per rank) and in one process (8), with the same global batch: the sampler draws
one seeded permutation and rank r takes the r-th consecutive batch of 4, FSDP averages the gradients,
and dropout is off. Only the order of float sums differs (per-rank loss means, the gradient
reduce-scatter, the engine's all-reduced skill sums): losses agree to ~2e-7 relative (measured), so
1e-5 leaves room for AdamW's amplification and is far below a step's own loss change (1e-2 and more),
which a differently decided phase or a differently applied update would show (an update lost to a
stale unsharded copy moved the next loss by 1%). Gradient norms are more sensitive to the summation
order (measured up to 2e-5 after predict phases): 1e-4; a per-shard norm would be ~30% off.
The same comparison runs for a peft LoRA model, whose adapters FSDP2 shards with the frozen weights.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from hf_hybrid.checkpoint import HYBRID_STATE_FILE, HybridCheckpointError, read_json

pytestmark = pytest.mark.distributed

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "programs" / "fsdp2_trainer_run.py"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
REL_TOL = 1e-5
GRAD_NORM_TOL = 1e-4
# Gathered weights against the one-process run, absolute, on weights of order 0.02-1 after 40 AdamW steps:
# measured at most 1.7e-6 (full model) and 1.6e-7 (LoRA adapters) on one machine, and 5.1e-6 (block 1's
# query weights) on an AMD EPYC with the same package versions: the CPU's kernels round differently. A
# sharding bug (a shard not updated, a gradient not averaged) moves weights by Adam steps of the lr, 3e-3,
# so 2e-5 still tells it apart by two orders of magnitude. The attention's key bias is apart: its
# gradient is zero in exact arithmetic (adding q.b_k to every score of a query leaves the softmax as it
# is), so it receives only rounding noise, which Adam normalises into lr-sized steps: measured 4.6e-5.
WEIGHT_TOL = 2e-5
KEY_BIAS_TOL = 2e-4
LORA_WEIGHT_TOL = 1e-6


def _start(cmd: list[str], out: Path, *extra: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    log = open(out / "log.txt", "w")  # noqa: SIM115 - closed by _finish
    argv = [*cmd, str(SCRIPT), "--out", str(out), *extra]
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)


def _finish(proc: subprocess.Popen, out: Path) -> str:
    try:
        rc = proc.wait(timeout=300)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait()
    proc.stdout and proc.stdout.close()
    text = (out / "log.txt").read_text()
    assert rc == 0, text[-4000:]
    return text


def _load(out: Path, scenario: str, rank: int) -> dict[str, Any]:
    return json.loads((out / f"{scenario}_rank{rank}.json").read_text())


def _close(a: float, b: float, tol: float = REL_TOL) -> bool:
    return abs(a - b) <= tol * max(abs(a), abs(b))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Any]:
    """The 2-rank FSDP2 launch (train with a save inside a predict phase; resume from it; a NaN fault)
    and the one-process reference, started side by side."""
    sharded, single = tmp_path_factory.mktemp("fsdp2"), tmp_path_factory.mktemp("single")
    fsdp = _start(TORCHRUN, sharded, "--fsdp", "--batch", "4")
    alone = _start([sys.executable], single, "--batch", "8", "--scenarios", "run")
    log = _finish(fsdp, sharded)
    _finish(alone, single)
    return {
        "ranks": [_load(sharded, "run", r) for r in (0, 1)],
        "resumed": [_load(sharded, "resume", r) for r in (0, 1)],
        "faults": [_load(sharded, "faults", r) for r in (0, 1)],
        "garbage": [_load(sharded, "garbage", r) for r in (0, 1)],
        "single": _load(single, "run", 0),
        "dir": sharded,
        "single_dir": single,
        "log": log,
    }


def test_the_trainer_really_ran_fsdp2_on_two_ranks(runs):
    for rank, result in enumerate(runs["ranks"]):
        assert (result["rank"], result["world_size"]) == (rank, 2)
        assert (
            result["distributed_type"] == "DistributedType.FSDP" and result["fsdp"] and result["forced_fsdp2"]
        )
        assert result["sharded"]  # the engine sees DTensors: predict phases are on under FSDP2
    assert not runs["single"]["sharded"] and runs["single"]["world_size"] == 1
    assert "under FSDP" not in runs["log"] and "predict phases are off" not in runs["log"]


def test_the_engine_names_the_parameters_as_the_bare_model_does(runs):
    rank0, rank1 = runs["ranks"]
    assert rank0["engine_params"] == rank1["engine_params"] == runs["single"]["engine_params"]
    assert "transformer.h.0.attn.c_attn.weight" in rank0["engine_params"]
    assert not [n for n in rank0["engine_params"] if "_fsdp_wrapped_module" in n or "_orig_mod" in n]


def _without_bytes(stats):
    return {key: value for key, value in stats.items() if not key.endswith("_bytes")}


def test_every_rank_takes_the_phases_of_one_process(runs):
    rank0, rank1 = runs["ranks"]
    assert rank0["phases"] == rank1["phases"] == runs["single"]["phases"]
    assert rank0["phases"].count("predict") >= 8
    # the same decisions and counters; the bytes are each rank's own (its shards, its part of the sample)
    assert _without_bytes(rank0["stats"]) == _without_bytes(rank1["stats"])
    assert rank0["stats"]["predict_phases"] >= 3
    assert rank0["stats"]["steps_per_phase"] == runs["single"]["stats"]["steps_per_phase"]
    # the spike guard is on by default, its update check too (the norms summed over the ranks' shards),
    # and it decides what one process decides
    assert rank0["stats"]["spike_guard"] and rank0["stats"]["update_check"]
    guard_keys = ("restore_steps", "skip_steps", "taken_back_steps", "spike_guard_copy_every", "update_check")
    assert {k: rank0["stats"][k] for k in guard_keys} == {k: runs["single"]["stats"][k] for k in guard_keys}


def test_losses_and_gradient_norms_match_one_process_with_the_same_global_batch(runs):
    rank0, rank1 = runs["ranks"]
    single = runs["single"]
    assert rank0["losses"] == rank1["losses"]
    assert len(rank0["losses"]) == len(single["losses"]) == 40
    far = [
        (i + 1, a, b)
        for i, (a, b) in enumerate(zip(rank0["losses"], single["losses"], strict=True))
        if not _close(a, b)
    ]
    assert not far, f"steps whose loss differs by more than {REL_TOL} relative: {far[:5]}"
    # the engine's gradient norm is the logged one: the whole model's, not this rank's shard's
    assert len(rank0["grad_norms"]) == len(single["grad_norms"]) == 40 - rank0["phases"].count("predict")
    pairs = zip(rank0["grad_norms"], single["grad_norms"], strict=True)
    assert all(_close(a, b, GRAD_NORM_TOL) for a, b in pairs), (rank0["grad_norms"], single["grad_norms"])


def test_gathered_weights_are_equal_across_ranks_and_match_one_process(runs):
    rank0, rank1 = runs["ranks"]
    assert rank0["params_sha256"] == rank1["params_sha256"]
    sharded = load_file(str(runs["dir"] / "run_weights.safetensors"))
    single = load_file(str(runs["single_dir"] / "run_weights.safetensors"))
    assert sharded.keys() == single.keys()
    gaps = {n: (sharded[n] - single[n]).abs() for n in single}
    width = single["transformer.wte.weight"].shape[1]
    key_bias = {n: gap[width : 2 * width] for n, gap in gaps.items() if n.endswith("attn.c_attn.bias")}
    assert len(key_bias) == 2  # (q, k, v) biases of the two blocks
    for name in key_bias:
        gaps[name] = torch.cat([gaps[name][:width], gaps[name][2 * width :]])
    worst = max(float(gap.max()) for gap in gaps.values())
    assert worst <= WEIGHT_TOL, worst
    assert max(float(gap.max()) for gap in key_bias.values()) <= KEY_BIAS_TOL


def test_every_rank_writes_its_own_checksummed_hybrid_state(runs):
    rank0 = runs["ranks"][0]
    step = rank0["saved_at"]["mid_predict"]
    folder = runs["dir"] / "run" / f"checkpoint-{step}"
    entry = rank0["entries"][str(step)]
    assert entry["sharding"] == {"world_size": 2}
    assert not (folder / HYBRID_STATE_FILE).exists()  # the per-rank layout only
    for rank, pair in enumerate(entry["ranks"]):
        assert pair["tensor_file"] == f"hybrid_state_rank{rank}.safetensors"
        assert pair["state_file"] == f"hybrid_state_rank{rank}.json.gz"
        for kind, name in (("tensors", pair["tensor_file"]), ("state", pair["state_file"])):
            assert pair["sha256"][kind] == hashlib.sha256((folder / name).read_bytes()).hexdigest()
        tree = read_json(folder / pair["state_file"])
        assert tree["sharding"] == {"world_size": 2, "rank": rank}
        assert tree["controller"]["phase"] == "predict" and tree["guard"]["snapshot"]
    assert not list(folder.glob("*.tmp"))


def test_resume_on_the_same_world_size_is_exact(runs):
    run0 = runs["ranks"][0]
    resumed0, resumed1 = runs["resumed"]
    step = resumed0["resumed_from"]
    assert step == run0["saved_at"]["mid_predict"] and run0["phases"][step - 1] == "predict"
    assert resumed0["phases"] == resumed1["phases"] == run0["phases"]
    assert resumed0["losses"][step:] == run0["losses"][step:]  # bit for bit
    assert len(resumed0["losses"]) == 40
    assert resumed0["params_sha256"] == resumed1["params_sha256"] == run0["params_sha256"]


def test_a_nan_predicted_on_one_rank_is_refused_on_all(runs):
    event0, event1 = (r["event"] for r in runs["faults"])
    assert event0 and event0 == event1  # the same step, action and reasons on both ranks
    assert event0["phase"] == "predict" and not event0["applied"]
    assert any("non-finite" in reason for reason in event0["reasons"])
    assert event0["unchanged"] and event1["unchanged"]  # rank 0's finite shards were not written either


def _script_module() -> Any:
    spec = importlib.util.spec_from_file_location("fsdp2_trainer_run", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_blamed_step_trains_on_each_rank_s_own_clean_batches_alike(runs):
    """Random tokens in steps 51-52 on both ranks: the second is blamed, and each rank remakes the step's
    gradient from its own batch of step 50 through the sharded model; both decide alike (their bytes
    differ with the shards) and end with the same gathered weights."""
    ranks = runs["garbage"]
    assert all(rank["sharded"] for rank in ranks)
    decided = [{k: v for k, v in rank["stats"].items() if "bytes" not in k} for rank in ranks]
    assert decided[0] == decided[1] and decided[0]["replay_steps"] == [52]
    assert ranks[0]["params_sha256"] == ranks[1]["params_sha256"]


def test_another_world_size_is_refused_in_one_process(runs, tmp_path):
    """The 2-rank checkpoint in one process: refused before any weight is loaded, naming both sizes."""
    module = _script_module()
    step = runs["ranks"][0]["saved_at"]["mid_predict"]
    checkpoint = str(runs["dir"] / "run" / f"checkpoint-{step}")
    opts = module.parse(["--out", str(tmp_path), "--batch", "8", "--steps", "1"])
    trainer = module.trainer_for(opts, str(tmp_path / "refused"))
    with pytest.raises(
        HybridCheckpointError, match=r"world size of 2.*world size of 1.*hybrid_restart_engine=True"
    ):
        trainer.train(resume_from_checkpoint=checkpoint)
    assert trainer.state.global_step == 0


def test_another_world_size_is_refused_unless_the_engine_restarts(runs, tmp_path):
    """The 2-rank checkpoint on three FSDP2 ranks, through `train(resume_from_checkpoint=...)`: refused
    before any forward; with `hybrid_restart_engine=True` it resumes, every rank's new engine sharded over
    three, with the counters of the saved run, and trains on with a new warmup.

    (Three ranks, not one: the Trainer itself refuses an FSDP checkpoint in a run without FSDP, and the
    CPU shim forces FSDP2 on several gloo processes only.)"""
    run0 = runs["ranks"][0]
    step = run0["saved_at"]["mid_predict"]
    checkpoint = runs["dir"] / "run" / f"checkpoint-{step}"
    steps = step + 3
    extra = ["--fsdp", "--batch", "4", "--scenarios", "restart", "--steps", str(steps)]
    three_ranks = [*TORCHRUN[:-1], "3"]
    log = _finish(_start(three_ranks, tmp_path, *extra, "--restart-from", str(checkpoint)), tmp_path)
    results = [_load(tmp_path, "restart", r) for r in (0, 1, 2)]
    for rank, result in enumerate(results):
        assert (result["rank"], result["world_size"], result["engine_world_size"]) == (rank, 3, 3)
        assert result["sharded"]
        refused = result["refused"]
        assert re.search(r"world size of 2.*world size of 3.*hybrid_restart_engine=True", refused["message"])
        assert refused["forwards"] == refused["steps"] == 0
        assert result["global_step"] == steps and result["steps_run"] == 3
        saved = run0["phases"][:step]
        assert result["phases"] == [*saved, "warmup", "warmup", "warmup"]  # the timeline carries on
        counted = Counter(result["phases"])
        assert result["stats"]["steps_per_phase"] == {
            p: counted[p] for p in ("warmup", "full", "predict", "correct")
        }
    # the same counters on every rank (bytes differ: 3 ranks shard the rows unevenly)
    per_rank = [{k: v for k, v in r["stats"].items() if "bytes" not in k} for r in results]
    assert per_rank[0] == per_rank[1] == per_rank[2]
    assert results[0]["losses"] == results[1]["losses"] == results[2]["losses"]
    assert log.count("hybrid_restart_engine=True: a new engine from") == 3  # once per rank
    assert log.count("the counters, the engine's time and peak bytes, and the phase timeline carry on") == 3


def test_lora_adapters_under_fsdp2_predict_like_one_process(tmp_path):
    """A peft LoRA model (r=4 on c_attn): accelerate shards the adapters with the frozen base weights;
    the engine sees only the adapters, as DTensors, and follows the one-process run."""
    sharded, single = tmp_path / "fsdp2", tmp_path / "single"
    sharded.mkdir(), single.mkdir()
    fsdp = _start(TORCHRUN, sharded, "--fsdp", "--lora", "--batch", "4", "--scenarios", "run", "--no-save")
    alone = _start([sys.executable], single, "--lora", "--batch", "8", "--scenarios", "run", "--no-save")
    _finish(fsdp, sharded)
    _finish(alone, single)
    rank0, rank1 = (_load(sharded, "run", r) for r in (0, 1))
    reference = _load(single, "run", 0)
    assert rank0["sharded"] and rank1["sharded"] and not reference["sharded"]
    assert rank0["engine_params"] == reference["engine_params"]
    assert all("lora_" in name for name in rank0["engine_params"])
    assert rank0["phases"] == rank1["phases"] == reference["phases"]
    assert rank0["phases"].count("predict") >= 8
    assert rank0["params_sha256"] == rank1["params_sha256"]
    pairs = zip(rank0["losses"], reference["losses"], strict=True)
    assert all(_close(a, b) for a, b in pairs), (rank0["losses"], reference["losses"])
    gathered = load_file(str(sharded / "run_weights.safetensors"))  # the adapters, gathered
    alone_weights = load_file(str(single / "run_weights.safetensors"))
    adapters = [name for name in alone_weights if "lora_" in name]
    assert adapters and gathered.keys() == alone_weights.keys()
    assert max(float((gathered[n] - alone_weights[n]).abs().max()) for n in adapters) <= LORA_WEIGHT_TOL
