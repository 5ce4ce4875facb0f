"""Several processes: `accelerate launch` with the shipped configs, and torchrun, as real subprocesses.

Two gloo ranks on CPU (multi_process_ddp.yaml + use_cpu=True) train the tiny GPT-2 with predict phases
next to one process with the same global batch (single_process.yaml, 8 per device vs 4 x 2 ranks).
Why the loss curves can be compared step by step: the Trainer's sampler draws one seeded permutation
and accelerate hands rank r the r-th consecutive batch of 4, so a global step sees exactly the 8
samples the single process sees in its batch of 8; the logged loss is the mean of the ranks' means
(equal token counts: full blocks), and DDP averages the gradients. Dropout is off in the script (each
rank draws its own masks, no single process can). What differs is only the order of float sums
(per-rank means, the gradient all-reduce), so per-step losses agree to a few float32 ulps (measured:
<= 2.4e-7 relative over 40 steps); 1e-5 relative leaves room for the drift AdamW can amplify and is
still far below the loss's own change from one step to the next (1e-2 and more here), which is what a
different batch or a differently predicted update would show.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import counters

from hf_hybrid.checkpoint import HYBRID_STATE_FILE, HYBRID_STATE_JSON, read_json

pytestmark = pytest.mark.distributed

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "programs" / "distributed_run.py"
CONFIGS = ROOT / "examples" / "accelerate_configs"
ACCELERATE = [sys.executable, "-m", "accelerate.commands.launch"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
REL_TOL = 1e-5
STEPS = 40


def _start(cmd: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    handle = open(log, "w")  # noqa: SIM115 - closed by _finish
    return subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=ROOT)


def _finish(proc: subprocess.Popen, log: Path, timeout: int = 240) -> tuple[int, str]:
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        rc = -9
    proc.stdout and proc.stdout.close()
    return rc, log.read_text()


def _results(out: Path, ranks: int) -> list[dict[str, Any]]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= REL_TOL * max(abs(a), abs(b))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Any]:
    """One 2-rank DDP run (with checkpoints) and one single-process run, started side by side."""
    ddp, single = tmp_path_factory.mktemp("ddp"), tmp_path_factory.mktemp("single")
    procs = {
        "ddp": _start(
            [*ACCELERATE, "--config_file", str(CONFIGS / "multi_process_ddp.yaml"), str(SCRIPT)]
            + ["--out", str(ddp), "--batch", "4", "--max-steps", str(STEPS), "--save-at-kinds"],
            ddp / "log.txt",
        ),
        "single": _start(
            [*ACCELERATE, "--config_file", str(CONFIGS / "single_process.yaml"), str(SCRIPT)]
            + ["--out", str(single), "--batch", "8", "--max-steps", str(STEPS)],
            single / "log.txt",
        ),
    }
    for name, out in (("ddp", ddp), ("single", single)):
        rc, log = _finish(procs[name], out / "log.txt")
        assert rc == 0, f"{name} run failed (rc={rc}):\n{log[-4000:]}"
    return {"ddp": _results(ddp, 2), "single": _results(single, 1)[0], "ddp_dir": ddp, "single_dir": single}


def test_two_gloo_ranks_really_trained_together(runs):
    ranks = runs["ddp"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert [r["world_size"] for r in ranks] == [2, 2]  # not two lone processes, not one process
    assert {r["distributed_type"] for r in ranks} == {"DistributedType.MULTI_CPU"}
    assert runs["single"]["world_size"] == 1


def test_every_rank_takes_the_same_phase_at_every_step(runs):
    rank0, rank1 = runs["ddp"]
    assert len(rank0["phases"]) == STEPS
    assert rank0["phases"] == rank1["phases"]
    assert rank0["phases"].count("predict") >= 4
    assert counters(rank0["stats"]) == counters(rank1["stats"])
    assert rank0["stats"]["backward_skipped"] == rank0["phases"].count("predict")


def test_trainable_parameters_are_bit_identical_across_ranks_after_predict_phases(runs):
    rank0, rank1 = runs["ddp"]
    assert rank0["stats"]["predict_phases"] >= 2
    assert rank0["params_sha256"] == rank1["params_sha256"]


def test_loss_curve_matches_one_process_with_the_same_global_batch(runs):
    rank0, rank1 = runs["ddp"]
    single = runs["single"]
    assert rank0["losses"] == rank1["losses"]  # the logged loss is gathered over ranks
    assert rank0["phases"] == single["phases"]
    assert len(rank0["losses"]) == len(single["losses"]) == STEPS
    far = [
        (step, a, b)
        for step, (a, b) in enumerate(zip(rank0["losses"], single["losses"], strict=True))
        if not _close(a, b)
    ]
    assert not far, f"steps whose loss differs by more than {REL_TOL} relative: {far[:5]}"
    assert rank0["stats"]["steps_per_phase"] == single["stats"]["steps_per_phase"]


def test_only_rank_zero_writes_the_hybrid_state_and_the_json_entry_is_complete(runs):
    rank0, rank1 = runs["ddp"]
    assert set(rank0["saved_at"]) == {"mid_predict", "correct"}
    saves0, saves1 = rank0["engine_saves"], rank1["engine_saves"]
    assert [s["step"] for s in saves0] == [s["step"] for s in saves1]  # the save runs on every rank
    assert {rank0["saved_at"]["mid_predict"], rank0["saved_at"]["correct"]} <= {s["step"] for s in saves0}
    assert all(s["wrote"] and s["sha256"] for s in saves0)
    assert not any(s["wrote"] or s["sha256"] for s in saves1)
    for save in saves0:
        folder = runs["ddp_dir"] / f"checkpoint-{save['step']}"
        state = json.loads((folder / "trainer_state.json").read_text())
        entry = state["stateful_callbacks"]["HybridStateCallback"]["attributes"]["engine_state"]
        assert entry["sha256"]["tensors"] == save["sha256"] == _sha256(folder / HYBRID_STATE_FILE)
        assert entry["sha256"]["state"] == _sha256(folder / HYBRID_STATE_JSON)
        assert entry["tensor_file"] == HYBRID_STATE_FILE
        assert read_json(folder / HYBRID_STATE_JSON)["config"]["predictor"] == "ema"
        assert not list(folder.glob("*.tmp"))
    mid = runs["ddp_dir"] / f"checkpoint-{rank0['saved_at']['mid_predict']}"
    tree = read_json(mid / HYBRID_STATE_JSON)
    assert tree["controller"]["phase"] == "predict"
    assert tree["guard"]["snapshot"]  # the open phase's rollback point


def test_a_two_rank_checkpoint_resumes_in_one_process_on_the_same_curve(runs, tmp_path):
    rank0 = runs["ddp"][0]
    single = runs["single"]
    step = rank0["saved_at"]["mid_predict"]
    spec = importlib.util.spec_from_file_location("distributed_run", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    opts = module.parse(
        ["--out", str(tmp_path), "--batch", "8", "--max-steps", str(STEPS)]
        + ["--resume", str(runs["ddp_dir"] / f"checkpoint-{step}")]
    )
    resumed = module.run(opts)
    assert resumed["world_size"] == 1
    assert resumed["phases"] == single["phases"]
    after = resumed["losses"][-(STEPS - step) :]
    expected = single["losses"][-(STEPS - step) :]
    assert len(after) == STEPS - step
    far = [(a, b) for a, b in zip(after, expected, strict=True) if not _close(a, b)]
    assert not far, far[:5]


def test_a_process_of_a_launch_that_trains_alone_is_refused(tmp_path, monkeypatch):
    """In-process twin of the torchrun test below: WORLD_SIZE says 2, the accelerator has 1 process."""
    from helpers import hybrid_trainer

    trainer = hybrid_trainer(tmp_path, max_steps=2)
    assert trainer.accelerator.num_processes == 1
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(
        ValueError, match=r"WORLD_SIZE=2 processes, but this process trains alone.*use_cpu=True"
    ):
        trainer.train()
    assert trainer.state.global_step == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the processes join over NCCL")
def test_processes_launched_without_use_cpu_on_a_cpu_machine_are_refused(tmp_path):
    """torchrun starts 2 processes, but with use_cpu=False and no GPU each one would train alone."""
    log = tmp_path / "log.txt"
    proc = _start(
        [*TORCHRUN, "--nproc_per_node", "2", str(SCRIPT), "--out", str(tmp_path)]
        + ["--max-steps", "2", "--no-use-cpu"],
        log,
    )
    rc, text = _finish(proc, log)
    assert rc != 0
    assert "launched as one of WORLD_SIZE=2 processes, but this process trains alone" in text
    assert "use_cpu=True" in text
    assert not list(tmp_path.glob("rank*.json"))


@pytest.mark.gpu
@pytest.mark.skipif(
    torch.cuda.device_count() < 2, reason="real FSDP2 through accelerate needs 2 CUDA devices"
)
def test_fsdp2_predicts_on_two_gpus(tmp_path):
    """accelerate's own FSDP2 path (no CPU shim): the same phases and weights on both ranks, predict
    phases on. The CPU twin with every check is tests/test_fsdp2_trainer.py."""
    log = tmp_path / "log.txt"
    script = ROOT / "tests" / "programs" / "fsdp2_trainer_run.py"
    proc = _start(
        [*TORCHRUN, "--nproc_per_node", "2", str(script), "--out", str(tmp_path)]
        + ["--fsdp", "--batch", "4", "--no-use-cpu", "--scenarios", "run"],
        log,
    )
    rc, text = _finish(proc, log)
    assert rc == 0, text[-4000:]
    ranks = [json.loads((tmp_path / f"run_rank{r}.json").read_text()) for r in (0, 1)]
    assert all(r["distributed_type"] == "DistributedType.FSDP" and not r["forced_fsdp2"] for r in ranks)
    assert all(r["sharded"] for r in ranks)
    assert ranks[0]["phases"] == ranks[1]["phases"] and ranks[0]["phases"].count("predict") >= 4
    assert ranks[0]["params_sha256"] == ranks[1]["params_sha256"]
    assert ranks[0]["losses"] == ranks[1]["losses"]


@pytest.mark.gpu
@pytest.mark.skipif(
    torch.cuda.device_count() < 2 or importlib.util.find_spec("deepspeed") is None,
    reason="DeepSpeed ZeRO-2 through accelerate needs 2 CUDA devices and the deepspeed package",
)
def test_deepspeed_trains_like_the_plain_trainer_and_says_why(tmp_path):
    """The shipped ZeRO-2 config: one warning that names DeepSpeed and the alternative, no engine, no
    predicted step, and both ranks end on the same weights (the run is the plain Trainer's)."""
    log = tmp_path / "log.txt"
    proc = _start(
        [*ACCELERATE, "--config_file", str(CONFIGS / "deepspeed_zero2.yaml"), str(SCRIPT)]
        + ["--out", str(tmp_path), "--batch", "4", "--max-steps", "20", "--no-use-cpu"],
        log,
    )
    rc, text = _finish(proc, log)
    assert rc == 0, text[-4000:]
    assert "DeepSpeed (every ZeRO stage) keeps the fp32 master weights" in text
    assert "use FSDP2 (fsdp_version: 2) or DDP" in text
    ranks = _results(tmp_path, 2)
    assert all(r["distributed_type"] == "DistributedType.DEEPSPEED" for r in ranks)
    assert all(not r["stats"]["enabled"] and r["stats"]["backward_skipped"] == 0 for r in ranks)
    assert all(r["phases"] == [] for r in ranks)
    assert ranks[0]["params_sha256"] == ranks[1]["params_sha256"]
