"""The hybrid engine on FSDP2-sharded parameters (`fully_shard`), or on one process with the same data.

    torchrun --standalone --nproc_per_node 2 fsdp_engine_run.py --out DIR     # two gloo ranks, sharded
    python fsdp_engine_run.py --out DIR                                       # one process, whole tensors
    ... --predictor adam --no-faults      # the Adam replay, which reads the optimizer's sharded state

A small MLP (the first layer's 255 rows split 128/127, the last layer's one row held by rank 0 only, so
rank 1's shard is empty) learns a regression with AdamW, through `HybridEngine` with a low confidence
threshold so that predict phases happen. Every step draws a global batch of 32; with R ranks, rank r
takes its r-th slice, and FSDP averages the gradients, so both launches train the same function.

Scenarios (each writes DIR/<scenario>_rank{R}.json):
- `run`: the plain hybrid run: phases, losses, the gathered trainable weights; the engine, model and
  optimizer state are saved (per rank) at the first step of the second predict phase, and a fresh
  engine, model and optimizer restored from them run to the end (`resumed`).
- `faults` (sharded only): a predicted update that is NaN on rank 1's shard only, one that is 1e6 times
  too large, a predictor that raises on rank 0 only, and a loss spike inside a predict phase whose
  rollback must restore every shard bit for bit.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from teardown import leave_process_group  # noqa: E402
from torch import nn  # noqa: E402

from hf_hybrid.engine.config import EngineConfig  # noqa: E402
from hf_hybrid.engine.engine import HybridEngine, StepOutcome, StepPlan, StepRecord  # noqa: E402
from hf_hybrid.engine.phases import Phase, PhaseSchedule  # noqa: E402
from hf_hybrid.engine.predictor import EMAPredictor  # noqa: E402
from hf_hybrid.engine.sharding import local  # noqa: E402
from hf_hybrid.engine.state import join_state, split_state  # noqa: E402

GLOBAL_BATCH = 32
LR = 3e-3


def world() -> tuple[int, int]:
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def build(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 255), nn.Tanh(), nn.Linear(255, 1))
    if dist.is_initialized():
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=LR)


def config(seed: int, predictor: str = "ema") -> EngineConfig:
    return EngineConfig(
        schedule=PhaseSchedule(warmup_steps=30, full_steps=5, max_predict_steps=8, confidence_threshold=0.3),
        predictor=predictor,
        check_every=1,
        seed=seed,
    )


def data(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed + 1000)
    x = torch.randn(512, 16, generator=g)
    y = x @ torch.randn(16, 1, generator=g) + 0.1 * torch.randn(512, 1, generator=g)
    return x, y


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor (gathered from its shards under FSDP)."""
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


def mean_over_ranks(value: torch.Tensor) -> float:
    value = value.detach().clone()
    if dist.is_initialized():
        dist.all_reduce(value)
        value /= dist.get_world_size()
    return float(value)


class Loop:
    """The training loop of examples/plain_pytorch_loop.py, on this rank's slice of each global batch."""

    def __init__(self, seed: int, predictor: EMAPredictor | str = "ema") -> None:
        self.model, self.optimizer = build(seed)
        self.params = {n: p for n, p in self.model.named_parameters() if p.requires_grad}
        name, instance = (predictor, None) if isinstance(predictor, str) else ("ema", predictor)
        self.engine = HybridEngine(
            self.params, config(seed, name), optimizer=self.optimizer, predictor=instance
        )
        self.x, self.y = data(seed)
        self.generator = torch.Generator().manual_seed(seed)
        self.phases: list[str] = []
        self.losses: list[float | None] = []

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        rank, size = world()
        idx = torch.randint(0, len(self.x), (GLOBAL_BATCH,), generator=self.generator)
        part = idx.view(size, -1)[rank]
        return self.x[part], self.y[part]

    def step(self, hook: Callable[[StepPlan], float] | None = None) -> tuple[StepPlan, StepOutcome]:
        """One optimizer step; `hook(plan)`, called once the phase is known, returns a factor for the loss
        the engine is told about in a predict step (a loss spike)."""
        plan = self.engine.begin_step()
        spike = hook(plan) if hook else 1.0
        x, y = self.batch()
        loss = grad_norm = None
        if plan.phase.runs_backward:
            self.optimizer.zero_grad(set_to_none=True)
            value = nn.functional.mse_loss(self.model(x), y)
            value.backward()
            grad_norm = float(full(nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)))
            loss = mean_over_ranks(value)
        elif plan.measure_loss:
            with torch.no_grad():
                loss = mean_over_ranks(nn.functional.mse_loss(self.model(x), y)) * spike
        outcome = self.engine.finish_step(StepRecord(loss, grad_norm, LR), self.optimizer.step)
        self.phases.append(plan.phase.value)
        self.losses.append(loss)
        return plan, outcome

    def shards(self) -> dict[str, torch.Tensor]:
        return {n: local(p).detach().clone() for n, p in self.params.items()}

    def weights_sha256(self) -> str:
        digest = hashlib.sha256()
        for name, p in self.params.items():
            digest.update(name.encode())
            digest.update(full(p).numpy().tobytes())
        return digest.hexdigest()

    def save(self, path: Path) -> None:
        """This rank's engine state (its shards), model shards, optimizer state and data position."""
        tree, tensors = split_state(self.engine.state_dict())
        torch.save(
            {
                "engine": (json.dumps(tree), tensors),
                "model": self.shards(),
                "optimizer": self.optimizer.state_dict(),
                "generator": self.generator.get_state(),
                "steps": len(self.phases),
            },
            path,
        )

    def load(self, path: Path) -> int:
        saved = torch.load(path, weights_only=False)
        with torch.no_grad():
            for name, p in self.params.items():
                local(p).copy_(saved["model"][name])
        self.optimizer.load_state_dict(saved["optimizer"])
        tree, tensors = saved["engine"]
        self.engine.load_state_dict(join_state(json.loads(tree), tensors))
        self.generator.set_state(saved["generator"])
        return saved["steps"]


def run_scenario(opts: argparse.Namespace) -> dict[str, Any]:
    loop = Loop(opts.seed, opts.predictor)
    rank, size = world()
    state_file = opts.out / f"engine_rank{rank}.pt"
    saved_at = None
    phases_opened = 0
    for _ in range(opts.steps):
        plan, _ = loop.step()
        if plan.phase is Phase.PREDICT and loop.engine.phase is not None and loop.engine.phase.predicted == 1:
            phases_opened += 1
            if phases_opened == 2 and saved_at is None:
                loop.save(state_file)
                saved_at = len(loop.phases)
    result = {
        "rank": rank,
        "world_size": size,
        "sharded": loop.engine.shards.sharded,
        "phases": loop.phases,
        "losses": loop.losses,
        "weights": {n: full(p).tolist() for n, p in loop.params.items()},
        "weights_sha256": loop.weights_sha256(),
        "stats": {k: v for k, v in loop.engine.stats().items() if not k.startswith("engine_")},
        "saved_at": saved_at,
        "saved_phase": None,
    }
    resumed = Loop(opts.seed, opts.predictor)
    start = resumed.load(state_file)
    result["saved_phase"] = resumed.engine.controller.phase.value if resumed.engine.controller.phase else None
    for _ in range(opts.steps - start):
        resumed.step()
    result["resumed"] = {
        "phases": resumed.phases,
        "losses": resumed.losses,
        "weights_sha256": resumed.weights_sha256(),
        "stats": {k: v for k, v in resumed.engine.stats().items() if not k.startswith("engine_")},
    }
    return result


class FaultyEMA(EMAPredictor):
    """The EMA predictor, misbehaving on command: `fault` is read (and cleared) by the next `predict`."""

    name = "ema"  # the same state format as the EMA it wraps

    def __init__(self) -> None:
        super().__init__()
        self.fault: str | None = None

    def predict(self, steps_ahead: int):
        fault, self.fault = self.fault, None
        out = super().predict(steps_ahead)
        rank, _ = world()
        if fault == "nan_on_rank1" and rank == 1:
            out["0.weight"] = out["0.weight"].clone()
            out["0.weight"].view(-1)[0] = float("nan")
        elif fault == "wild":
            out = {name: t * 1e6 for name, t in out.items()}
        elif fault == "raise_on_rank0" and rank == 0:
            raise RuntimeError("injected predictor failure")
        return out


def fault_scenario(opts: argparse.Namespace) -> dict[str, Any]:
    """Each fault once, in the first predict step where it can be aimed, recorded with what it did."""
    predictor = FaultyEMA()
    loop = Loop(opts.seed, predictor=predictor)
    engine = loop.engine
    pending = ["nan_on_rank1", "wild", "raise_on_rank0", "spike"]
    events: list[dict[str, Any]] = []
    aimed: dict[str, Any] = {}

    def hook(plan: StepPlan) -> float:
        if plan.phase is not Phase.PREDICT or not pending or aimed:
            return 1.0
        # a rollback must have something to undo: a predicted update applied since the snapshot
        if pending[0] == "spike" and engine.steps_since_real < 1:
            return 1.0
        aimed["fault"] = pending.pop(0)
        aimed["before"] = loop.shards()
        aimed["before_full"] = {n: full(p) for n, p in loop.params.items()}
        aimed["snapshot"] = {n: t.clone() for n, t in engine.guard.snapshot.items()}
        if aimed["fault"] == "spike":
            return 1000.0
        predictor.fault = aimed["fault"]
        return 1.0

    for _ in range(opts.steps):
        _, outcome = loop.step(hook)
        if not aimed:
            if not pending:
                break
            continue
        after = loop.shards()
        before, snapshot = aimed["before"], aimed["snapshot"]
        event = {
            "fault": aimed["fault"],
            "step": len(loop.phases) - 1,
            "applied": outcome.applied_update,
            "rolled_back": outcome.rolled_back,
            "action": outcome.action.value,
            "reasons": list(outcome.reasons),
            "unchanged": all(torch.equal(before[n], after[n]) for n in before),
            "moved_since_snapshot": any(not torch.equal(snapshot[n], before[n]) for n in snapshot),
            "restored_snapshot": bool(snapshot) and all(torch.equal(snapshot[n], after[n]) for n in snapshot),
        }
        if aimed["fault"] == "wild":
            cap = engine.config.max_delta * (1 + 1e-5)
            event["within_trust_region"] = all(
                float((full(p) - aimed["before_full"][n]).norm())
                <= cap * float(aimed["before_full"][n].norm())
                for n, p in loop.params.items()
            )
        events.append(event)
        aimed.clear()
    rank, size = world()
    return {
        "rank": rank,
        "world_size": size,
        "events": events,
        "phases": loop.phases,
        "weights_sha256": loop.weights_sha256(),
        "stats": {k: v for k, v in engine.stats().items() if not k.startswith("engine_")},
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--predictor", default="ema", help="the `run` scenario's predictor")
    parser.add_argument("--no-faults", action="store_true", help="skip the `faults` scenario")
    opts = parser.parse_args()
    torch.set_num_threads(1)
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group("gloo")
    rank, _ = world()
    faults = dist.is_initialized() and not opts.no_faults
    scenarios = {"run": run_scenario, **({"faults": fault_scenario} if faults else {})}
    for name, scenario in scenarios.items():
        result = scenario(opts)
        (opts.out / f"{name}_rank{rank}.json").write_text(json.dumps(result))
    leave_process_group()


if __name__ == "__main__":
    main()
