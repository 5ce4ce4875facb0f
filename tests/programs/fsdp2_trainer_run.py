"""HybridHFTrainer under accelerate's FSDP2 on every rank (torchrun), or one process alone (reference).

    torchrun --standalone --nproc_per_node 2 fsdp2_trainer_run.py --out DIR --fsdp --batch 4
    python fsdp2_trainer_run.py --out DIR --batch 8                 # one process, same global batch
    ... --lora                                                      # a peft LoRA model instead
    ... --no-use-cpu                                                # a GPU machine: real accelerate FSDP2

On CPU, `--fsdp` goes through tests/programs/fsdp2_cpu_shim.py (accelerate refuses FSDP on CPU; the shim
forces its FSDP2 path on gloo); on GPUs accelerate enables FSDP2 itself and the shim does nothing.

The model is a GPT-2 from config (2 layers, 64 wide, byte vocabulary), dropout off (every rank would
draw its own masks, which no single process reproduces). Scenarios, in one process each (start-up is
the expensive part), each writing DIR/<scenario>_rank{R}.json:
- `run`: 40 steps with predict phases, a checkpoint saved inside a predict phase (`saved_at`; none
  with `--no-save`), the gathered trainable weights in DIR/run_weights.safetensors;
  phases, logged losses and gradient norms, the engine's parameter names and whether it sees shards,
  a SHA-256 of the gathered trainable weights, the hybrid entry of every save;
- `resume` (with `--fsdp`): a new trainer resumed from that checkpoint to step 40;
- `faults` (with `--fsdp`): a predicted update that is NaN on rank 1's shards only, in the first predict
  step: what the engine did on each rank, and whether the weights moved.
- `garbage` (with `--fsdp`): 60 steps, random tokens in steps 51-52 on every rank (each its own): what
  the spike guard did on each rank (a blamed step trains on each rank's own clean batches).
- `restart` (with `--fsdp` and `--restart-from CHECKPOINT`, launched on another number of ranks than
  the one that saved it): `train(resume_from_checkpoint=...)` first as is (refused: what it said, and
  whether any forward or step ran), then with `hybrid_restart_engine=True` to `--steps`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

torch.set_num_threads(1)

from distributed_run import params_sha256  # noqa: E402
from fsdp2_cpu_shim import with_fsdp2_on_cpu  # noqa: E402
from helpers import BLOCK, SaveAt, hybrid_args, step_logs, tiny_data  # noqa: E402
from teardown import leave_process_group  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, TrainerCallback  # noqa: E402

from hf_hybrid import HybridHFTrainer  # noqa: E402
from hf_hybrid.bench.measure.faults import FaultWindow, inject  # noqa: E402
from hf_hybrid.engine.phases import Phase  # noqa: E402
from hf_hybrid.engine.predictor import EMAPredictor  # noqa: E402
from hf_hybrid.engine.sharding import local  # noqa: E402

STEPS = 40
FSDP_CONFIG = {
    "fsdp_version": 2,
    "transformer_layer_cls_to_wrap": ["GPT2Block"],
    "reshard_after_forward": True,
}
Trainer = with_fsdp2_on_cpu(HybridHFTrainer)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--batch", type=int, default=4, help="per-device train batch size")
    parser.add_argument("--fsdp", action="store_true", help="FSDP2 through accelerate (forced on CPU)")
    parser.add_argument("--lora", action="store_true", help="a peft LoRA model (r=4 on c_attn)")
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--no-use-cpu", action="store_true", help="use_cpu=False (the GPUs)")
    parser.add_argument("--scenarios", default="run,resume,faults,garbage")
    parser.add_argument("--no-save", action="store_true", help="the `run` scenario saves no checkpoint")
    parser.add_argument("--restart-from", help="the checkpoint of the `restart` scenario")
    return parser.parse_args(argv)


def gpt2(lora: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=256, n_positions=BLOCK, n_embd=64, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0
    )
    config.resid_pdrop = config.embd_pdrop = config.attn_pdrop = 0.0
    model = GPT2LMHeadModel(config)
    if lora:
        from peft import LoraConfig, get_peft_model

        lora_config = LoraConfig(
            r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["c_attn"], fan_in_fan_out=True
        )
        model = get_peft_model(model, lora_config)
    return model


def trainer_for(opts: argparse.Namespace, out: str, predictor: Any = None, **overrides: Any) -> Any:
    fsdp = {"fsdp": "full_shard", "fsdp_config": FSDP_CONFIG} if opts.fsdp else {}
    args = hybrid_args(
        out,
        max_steps=opts.steps,
        per_device_train_batch_size=opts.batch,
        use_cpu=not opts.no_use_cpu,
        learning_rate=3e-3,
        **fsdp,
        **overrides,
    )
    train, evaluation = tiny_data()
    return Trainer(
        model=gpt2(opts.lora), args=args, train_dataset=train, eval_dataset=evaluation, predictor=predictor
    )


def rank_and_size(trainer: Any) -> tuple[int, int]:
    state = trainer.accelerator.state
    return state.process_index, state.num_processes


def describe(trainer: Any) -> dict[str, Any]:
    rank, size = rank_and_size(trainer)
    engine = trainer.engine
    return {
        "rank": rank,
        "world_size": size,
        "distributed_type": str(trainer.accelerator.state.distributed_type),
        "fsdp": trainer.is_fsdp_enabled,
        "forced_fsdp2": trainer.forced_fsdp2,
        "sharded": bool(engine and engine.shards.sharded),
        "engine_params": sorted(engine.params) if engine else [],
        "phases": [row["phase"] for row in trainer.hybrid_timeline],
        "losses": step_logs(trainer, "loss"),
        "grad_norms": step_logs(trainer, "grad_norm"),
        "params_sha256": params_sha256(trainer.model),
        "stats": {k: v for k, v in trainer.hybrid_stats().items() if k != "timing"},
    }


def save_gathered_weights(trainer: Any, path: str) -> None:
    """The full trainable tensors (gathered from their shards: a collective), written by rank 0."""
    full = {
        name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().cpu().contiguous()
        for name, p in sorted(trainer.engine.params.items())
    }
    if rank_and_size(trainer)[0] == 0:
        save_file(full, path)


def run_scenario(opts: argparse.Namespace) -> dict[str, Any]:
    save = {"save_strategy": "no"} if opts.no_save else {"save_strategy": "steps", "save_steps": 10_000}
    trainer = trainer_for(opts, os.path.join(opts.out, "run"), **save)
    saver = SaveAt(trainer, wanted=() if opts.no_save else ("mid_predict",))
    trainer.add_callback(saver)
    trainer.train()
    result = describe(trainer)
    save_gathered_weights(trainer, os.path.join(opts.out, "run_weights.safetensors"))
    result["saved_at"] = saver.saved
    entries = {}
    for step in saver.saved.values():
        state = json.loads(Path(opts.out, "run", f"checkpoint-{step}", "trainer_state.json").read_text())
        entries[step] = state["stateful_callbacks"]["HybridStateCallback"]["attributes"]["engine_state"]
    result["entries"] = entries
    return result


def resume_scenario(opts: argparse.Namespace) -> dict[str, Any]:
    rank = int(os.environ.get("RANK", "0"))
    saved = json.loads(Path(opts.out, f"run_rank{rank}.json").read_text())["saved_at"]["mid_predict"]
    trainer = trainer_for(opts, os.path.join(opts.out, "resume"))
    trainer.train(resume_from_checkpoint=os.path.join(opts.out, "run", f"checkpoint-{saved}"))
    return {**describe(trainer), "resumed_from": saved}


class NaNOnRank1(EMAPredictor):
    """The EMA predictor whose first guess applied in a predict step is NaN in rank 1's shards only."""

    name = "ema"  # the same state format as the EMA it wraps

    def __init__(self) -> None:
        super().__init__()
        self.trainer: Any = None
        self.fired_at: int | None = None

    def predict(self, steps_ahead: int) -> dict[str, torch.Tensor] | None:
        out = super().predict(steps_ahead)
        applying = self.trainer.engine.controller.phase is Phase.PREDICT  # not a FULL step's scoring guess
        if self.fired_at is not None or out is None or not applying:
            return out
        self.fired_at = self.trainer.state.global_step + 1
        if rank_and_size(self.trainer)[0] == 1:
            out = {name: t.clone() for name, t in out.items()}
            for tensor in out.values():
                if tensor.numel():
                    tensor.view(-1)[0] = float("nan")
        return out


class ShardsAroundFault(TrainerCallback):
    """This rank's shards just before and after the step in which the NaN guess is applied."""

    def __init__(self, trainer: Any, predictor: NaNOnRank1) -> None:
        self.trainer, self.predictor = trainer, predictor
        self.event: dict[str, Any] = {}
        self.before: str | None = None

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.predictor.fired_at is None:
            self.before = self.shards_sha256()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.predictor.fired_at == state.global_step and not self.event:
            outcome = self.trainer.optimizer.last_outcome
            self.event = {
                "step": state.global_step,
                "phase": outcome.phase.value,
                "applied": outcome.applied_update,
                "action": outcome.action.value,
                "reasons": list(outcome.reasons),
                "unchanged": self.shards_sha256() == self.before,
            }
            control.should_training_stop = True

    def shards_sha256(self) -> str:
        digest = hashlib.sha256()
        for name, p in sorted(self.trainer.engine.params.items()):
            digest.update(name.encode())
            digest.update(local(p).detach().cpu().contiguous().numpy().tobytes())
        return digest.hexdigest()


def faults_scenario(opts: argparse.Namespace) -> dict[str, Any]:
    predictor = NaNOnRank1()
    trainer = trainer_for(opts, os.path.join(opts.out, "faults"), predictor=predictor)
    predictor.trainer = trainer
    watch = ShardsAroundFault(trainer, predictor)
    trainer.add_callback(watch)
    trainer.train()
    rank, size = rank_and_size(trainer)
    return {"rank": rank, "world_size": size, "event": watch.event, "phases": describe(trainer)["phases"]}


def garbage_scenario(opts: argparse.Namespace) -> dict[str, Any]:
    longer = argparse.Namespace(**{**vars(opts), "steps": 60})
    guard = {"hybrid_confidence_threshold": 1.0, "hybrid_guard_every": 5}
    trainer = trainer_for(longer, os.path.join(opts.out, "garbage"), **guard)
    inject(trainer, FaultWindow("garbage", 50, 2), seed=trainer.args.process_index)
    trainer.train()
    return describe(trainer)


class Activity(TrainerCallback):
    """Forward passes and optimizer steps run by a trainer."""

    def __init__(self, trainer: Any) -> None:
        self.forwards = self.steps = 0
        trainer.model.register_forward_hook(self._forward)
        trainer.add_callback(self)

    def _forward(self, *args: Any) -> None:
        self.forwards += 1

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.steps += 1


def restart_scenario(opts: argparse.Namespace) -> dict[str, Any]:
    from hf_hybrid.checkpoint import HybridCheckpointError

    checkpoint = opts.restart_from
    refused = trainer_for(opts, os.path.join(opts.out, "refused"))
    activity = Activity(refused)
    try:
        refused.train(resume_from_checkpoint=checkpoint)
        message = None
    except HybridCheckpointError as exc:
        message = str(exc)
    refusal = {"message": message, "forwards": activity.forwards, "steps": activity.steps}
    trainer = trainer_for(opts, os.path.join(opts.out, "restart"), hybrid_restart_engine=True)
    activity = Activity(trainer)
    trainer.train(resume_from_checkpoint=checkpoint)
    return {
        **describe(trainer),
        "refused": refusal,
        "global_step": trainer.state.global_step,
        "steps_run": activity.steps,
        "engine_world_size": trainer.engine.shards.world_size,
    }


SCENARIOS = {
    "run": run_scenario,
    "resume": resume_scenario,
    "faults": faults_scenario,
    "garbage": garbage_scenario,
    "restart": restart_scenario,
}


def main() -> None:
    opts = parse()
    for name in opts.scenarios.split(","):
        result = SCENARIOS[name](opts)
        Path(opts.out, f"{name}_rank{result['rank']}.json").write_text(json.dumps(result))
    leave_process_group()


if __name__ == "__main__":
    main()
