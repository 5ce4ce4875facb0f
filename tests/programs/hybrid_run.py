"""A hybrid training run in its own process, for resume and crash tests.

python hybrid_run.py --out DIR [--resume PATH|last] [--save-every N | --save-at-kinds]
                     [--kill-in-save-at STEP] [--kill-at-step STEP] [--lora] [--accumulation N]
                     [--spike-guard on|off|auto] [--save-at-steps STEP ...]
                     --result FILE.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

torch.set_num_threads(1)

from helpers import SaveAt, hybrid_trainer, lora_gpt2, step_logs, tiny_gpt2  # noqa: E402

import hf_hybrid.checkpoint as checkpoint_module  # noqa: E402
from hf_hybrid.hybrid_arguments import SPIKE_GUARD_MODES, HybridArgumentsMixin  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--max-steps", type=int, default=40)
    parser.add_argument("--resume", default=None)
    parser.add_argument("--save-every", type=int, default=0)
    parser.add_argument("--save-at-kinds", action="store_true", help="save mid-predict and at a CORRECT step")
    parser.add_argument("--kill-in-save-at", type=int, default=0)
    parser.add_argument(
        "--kill-at-step", type=int, default=0, help="SIGKILL in the forward pass of this step"
    )
    parser.add_argument("--lora", action="store_true")
    parser.add_argument("--accumulation", type=int, default=1)
    parser.add_argument(
        "--spike-guard",
        default=HybridArgumentsMixin.hybrid_spike_guard,
        choices=SPIKE_GUARD_MODES,
        help="the library's default unless given: the uninterrupted runs it is compared with use it too",
    )
    parser.add_argument(
        "--save-at-steps",
        type=int,
        nargs="*",
        default=[],
        help="save at these steps too (a resumed run "
        "saves where the uninterrupted one did: a save rebases the spike guard's copies)",
    )
    parser.add_argument("--result", required=True)
    opts = parser.parse_args()

    model = lora_gpt2() if opts.lora else tiny_gpt2()
    every = opts.save_every or (10_000 if opts.save_at_kinds or opts.save_at_steps else 0)
    save = {"save_strategy": "steps", "save_steps": every} if every else {"save_strategy": "no"}
    trainer = hybrid_trainer(
        opts.out,
        model=model,
        max_steps=opts.max_steps,
        gradient_accumulation_steps=opts.accumulation,
        hybrid_spike_guard=opts.spike_guard,
        **save,
    )
    saver = SaveAt(trainer)
    if opts.save_at_kinds:
        trainer.add_callback(saver)
    if opts.save_at_steps:
        trainer.add_callback(SaveAtSteps(opts.save_at_steps))
    if opts.kill_in_save_at:
        _kill_inside_save(trainer, opts.kill_in_save_at)
    if opts.kill_at_step:
        _kill_at_step(trainer, opts.kill_at_step)
    resume = {"last": True, None: None}.get(opts.resume, opts.resume)
    trainer.train(resume_from_checkpoint=resume)
    digest = hashlib.sha256()
    for name, p in sorted(trainer.model.named_parameters()):
        digest.update(name.encode())
        digest.update(p.detach().cpu().numpy().tobytes())
    Path(opts.result).write_text(
        json.dumps(
            {
                "losses": step_logs(trainer, "loss"),
                "phases": [row["phase"] for row in trainer.hybrid_timeline],
                "params_sha256": digest.hexdigest(),
                "stats": trainer.hybrid_stats(),
                "global_step": trainer.state.global_step,
                "saved_at": saver.saved,
            }
        )
    )


class SaveAtSteps(TrainerCallback):
    def __init__(self, steps: list[int]) -> None:
        self.steps = set(steps)

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step in self.steps:
            control.should_save = True


def _kill_inside_save(trainer, step: int) -> None:
    """SIGKILL this process after the hybrid tensors of checkpoint-`step` were written, mid-save."""
    original = checkpoint_module.save_engine_state

    def save_then_die(state, folder, write_files, **kwargs):
        entry = original(state, folder, write_files, **kwargs)
        if trainer.state.global_step == step:
            os.kill(os.getpid(), signal.SIGKILL)
        return entry

    checkpoint_module.save_engine_state = save_then_die


def _kill_at_step(trainer, step: int) -> None:
    """SIGKILL this process in the middle of optimizer step `step` (0-based), after its phase was decided."""

    def hook(module, inputs, output):
        if trainer.state.global_step == step:
            os.kill(os.getpid(), signal.SIGKILL)
        return output

    trainer.model.register_forward_hook(hook)


if __name__ == "__main__":
    main()
