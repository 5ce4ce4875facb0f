"""A hybrid training run that every rank executes (torchrun / accelerate launch), or one process alone.

    torchrun --standalone --nproc_per_node 2 distributed_run.py --out DIR --batch 4
    accelerate launch --config_file fsdp2.yaml distributed_run.py --out DIR --batch 4
    python distributed_run.py --out DIR --batch 8            # the single-process reference
    ... --no-use-cpu                                         # on a GPU machine: the GPUs

Each rank writes DIR/rank{R}.json: rank, world size, the phase of every step, the logged loss of every
step, a SHA-256 of the full trainable parameters (gathered from their shards under FSDP),
`trainer.hybrid_stats()`, and every engine-state save (step, whether this rank wrote the tensor file,
the SHA-256 it recorded). Dropout is off so that a 2-rank run and a 1-process run with the same global
batch compute the same function: each rank draws its dropout masks from its own RNG stream, which no
single process reproduces.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

torch.set_num_threads(1)

from helpers import SaveAt, hybrid_trainer, step_logs, tiny_gpt2  # noqa: E402
from teardown import leave_process_group  # noqa: E402

import hf_hybrid.checkpoint as checkpoint_module  # noqa: E402
from hf_hybrid.bench.measure.faults import FaultWindow, inject  # noqa: E402


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, help="output_dir of the run; rank JSON files go here too")
    parser.add_argument("--batch", type=int, default=4, help="per-device train batch size")
    parser.add_argument("--max-steps", type=int, default=40)
    parser.add_argument("--save-at-kinds", action="store_true", help="save mid-predict and at a CORRECT step")
    parser.add_argument("--resume", default=None, help="checkpoint folder to resume from")
    parser.add_argument("--no-use-cpu", action="store_true", help="use_cpu=False (the GPUs, where there are)")
    parser.add_argument("--garbage", type=int, default=None, help="random tokens from this step, 2 steps")
    return parser.parse_args(argv)


def dropout_free_gpt2() -> torch.nn.Module:
    model = tiny_gpt2()
    for name in ("resid_pdrop", "embd_pdrop", "attn_pdrop"):
        setattr(model.config, name, 0.0)
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return model


def params_sha256(model: torch.nn.Module) -> str:
    """SHA-256 of the trainable parameters, full tensors (a collective under FSDP: every rank calls it)."""
    digest = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        if not p.requires_grad:
            continue
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        digest.update(name.encode())
        digest.update(full.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


@contextlib.contextmanager
def recorded_engine_saves(trainer: Any) -> Iterator[list[dict[str, Any]]]:
    """Log (step, wrote the tensor file, recorded SHA-256) for every engine-state save of this rank."""
    saves: list[dict[str, Any]] = []
    original = checkpoint_module.save_engine_state

    def save_and_record(
        state: dict[str, Any], folder: Any, write_files: bool, **kwargs: Any
    ) -> dict[str, Any]:
        entry = original(state, folder, write_files, **kwargs)
        sha = entry["sha256"]["tensors"]
        saves.append({"step": trainer.state.global_step, "wrote": write_files, "sha256": sha})
        return entry

    checkpoint_module.save_engine_state = save_and_record
    try:
        yield saves
    finally:
        checkpoint_module.save_engine_state = original


def run(opts: argparse.Namespace) -> dict[str, Any]:
    save = {"save_strategy": "steps", "save_steps": 10_000} if opts.save_at_kinds else {"save_strategy": "no"}
    guard = {"hybrid_confidence_threshold": 1.0, "hybrid_guard_every": 5} if opts.garbage is not None else {}
    trainer = hybrid_trainer(
        opts.out,
        model=dropout_free_gpt2(),
        max_steps=opts.max_steps,
        per_device_train_batch_size=opts.batch,
        use_cpu=not opts.no_use_cpu,
        **save,
        **guard,
    )
    if opts.garbage is not None:  # each rank its own random tokens
        inject(trainer, FaultWindow("garbage", opts.garbage, 2), seed=trainer.args.process_index)
    saver = SaveAt(trainer)
    if opts.save_at_kinds:
        trainer.add_callback(saver)
    with recorded_engine_saves(trainer) as saves:
        trainer.train(resume_from_checkpoint=opts.resume)
    state = trainer.accelerator.state
    result = {
        "rank": state.process_index,
        "world_size": state.num_processes,
        "distributed_type": str(state.distributed_type),
        "fsdp": trainer.is_fsdp_enabled,
        "phases": [row["phase"] for row in trainer.hybrid_timeline],
        "losses": step_logs(trainer, "loss"),
        "params_sha256": params_sha256(trainer.model),
        "stats": trainer.hybrid_stats(),
        "saved_at": saver.saved,
        "engine_saves": saves,
    }
    Path(opts.out, f"rank{result['rank']}.json").write_text(json.dumps(result))
    return result


def main() -> None:
    run(parse())
    leave_process_group()


if __name__ == "__main__":
    main()
