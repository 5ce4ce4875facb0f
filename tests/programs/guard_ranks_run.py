"""The spike guard on FSDP2-sharded parameters (`fully_shard`), two gloo ranks, or one process with the
same data: a regression MLP whose first layer's rows are split between the ranks and whose last layer is
held by rank 0 alone (rank 1's shard of it is empty), AdamW, the learning rate x100 for steps 41-43
(`tests/test_distributed_guard.py`). Every rank samples its own shards for the update check, the norms'
squares are summed over the ranks, so both judge alike and take the burst back, shard by shard. Writes
what each rank decided and its gathered weights to `<out>/rank<r>.json`."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from hf_hybrid.engine.config import SpikeGuardConfig
from hf_hybrid.engine.sharding import is_sharded
from hf_hybrid.engine.spike_guard import SpikeGuard

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from teardown import leave_process_group  # noqa: E402

BURST = range(41, 44)
STEPS = 60


def build() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 63), nn.Tanh(), nn.Linear(63, 1))
    if dist.is_initialized():
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def main(out: Path, sharded: bool) -> None:
    if sharded:
        dist.init_process_group("gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if sharded else (0, 1)
    model, optimizer = build()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1024, 8, generator=g)
    y = torch.sin(x.sum(1, keepdim=True))
    batch: list[torch.Tensor] = []

    def loss_of(part: list[torch.Tensor]) -> torch.Tensor:
        local_x, local_y = part
        loss = nn.functional.mse_loss(model(local_x), local_y)
        return loss

    def mean(value: torch.Tensor) -> float:
        value = value.detach().clone()
        if sharded:
            dist.all_reduce(value)
        return float(value) / world

    def suspect_loss() -> float:
        with torch.no_grad():
            return mean(loss_of(batch))

    guard = SpikeGuard(optimizer, SpikeGuardConfig(every=10), suspect_loss=suspect_loss)
    for step in range(1, STEPS + 1):
        rows = torch.arange(step * 32, step * 32 + 32) % 1024
        mine = rows.chunk(world)[rank]
        batch[:] = [x[mine], y[mine]]
        optimizer.zero_grad()
        loss = loss_of(batch)
        loss.backward()
        grads = [p.grad.full_tensor() if is_sharded(p.grad) else p.grad for p in model.parameters()]
        grad_norm = float(torch.nn.utils.get_total_norm(grads))
        for group in optimizer.param_groups:
            group["lr"] = 1.0 if step in BURST else 1e-2
        value = mean(loss)
        assert not guard.alarms(step, value, grad_norm)
        guard.before_update(step)
        optimizer.step()
        if guard.update_alarms(step):
            guard.take_back(step)
            guard.skipped(step)
        else:
            guard.observe(step, value, grad_norm)
    weights = [(p.full_tensor() if is_sharded(p) else p).detach() for p in model.parameters()]
    digest = hashlib.sha256(b"".join(w.contiguous().numpy().tobytes() for w in weights)).hexdigest()
    stats = {k: v for k, v in guard.stats().items() if not k.endswith("_bytes")}
    (out / f"rank{rank}.json").write_text(json.dumps({"stats": stats, "weights": digest}))
    if sharded:
        leave_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[-1]), sharded="--sharded" in sys.argv)
