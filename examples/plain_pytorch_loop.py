"""The hybrid engine in a plain PyTorch loop: no transformers, no Trainer, two engine calls per step.

    python examples/plain_pytorch_loop.py [--steps 300] [--seed 0]

A small MLP learns a noisy regression with AdamW. Each step the engine decides the phase
(`begin_step`); the loop runs the forward, and the backward only when the phase needs one; then
`finish_step` either calls `optimizer.step()` or applies the predicted update instead. The numbers it
prints are what happened in this run, not a benchmark: the lesson of this project's benchmark is that
skipped steps rarely beat a tuned learning rate (see benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch
from torch import nn

from hf_hybrid import EngineConfig, HybridEngine, PhaseSchedule, StepRecord


def run(steps: int = 300, seed: int = 0) -> dict[str, Any]:
    torch.manual_seed(seed)
    x = torch.randn(512, 16)
    y = x @ torch.randn(16, 1) + 0.1 * torch.randn(512, 1)
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    params = {name: p for name, p in model.named_parameters() if p.requires_grad}
    config = EngineConfig(
        schedule=PhaseSchedule(warmup_steps=30, full_steps=5, max_predict_steps=8, confidence_threshold=0.3),
        predictor="ema",
        check_every=1,  # measure the loss of every predicted step (a forward, no backward)
        seed=seed,
    )
    engine = HybridEngine(params, config, optimizer=optimizer)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        batch = torch.randint(0, len(x), (32,), generator=generator)
        plan = engine.begin_step()
        loss = grad_norm = None
        if plan.phase.runs_backward:
            optimizer.zero_grad(set_to_none=True)
            value = nn.functional.mse_loss(model(x[batch]), y[batch])
            value.backward()
            grad_norm = float(nn.utils.clip_grad_norm_(model.parameters(), 1.0))
            loss = value.item()
        elif plan.measure_loss:
            with torch.no_grad():
                loss = nn.functional.mse_loss(model(x[batch]), y[batch]).item()
        engine.finish_step(StepRecord(loss, grad_norm, learning_rate=3e-3), optimizer.step)
    with torch.no_grad():
        final = nn.functional.mse_loss(model(x), y).item()
    stats = engine.stats()
    return {
        "steps": stats["steps"],
        "steps_per_phase": stats["steps_per_phase"],
        "backward_skipped": stats["backward_skipped"],
        "rollbacks": stats["rollbacks"],
        "final_loss": final,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    opts = parser.parse_args()
    print(json.dumps(run(opts.steps, opts.seed), indent=2))


if __name__ == "__main__":
    main()
