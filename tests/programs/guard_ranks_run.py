"""Two ranks whose spike guards time their copies and their update check differently (rank 1's are
dearer): every rank must space the copies and keep or drop the check alike, or a restore would put each
rank back to a different step (`tests/test_distributed_guard.py`). Launched by torchrun, gloo on CPU;
writes what each rank decided to `<out>/rank<r>.json`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from hf_hybrid.engine.spike_guard import SpikeGuard, SpikeGuardConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from teardown import leave_process_group  # noqa: E402

STEP_SECONDS = 1.0
COPY_SECONDS = {0: 0.01, 1: 0.05}  # rank 0 alone: a copy every 10 steps; rank 1: every 40
CHECK_SECONDS = {0: 0.0, 1: 0.01}  # rank 0 alone: the check stays on; rank 1: off


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    now = [0.0]
    config = SpikeGuardConfig(every=10, max_copy_share=0.002, max_check_share=0.002)
    guard = SpikeGuard(optimizer, config, clock=lambda: now[0])
    for store in (guard.pending, guard.trusted):
        take = store.take

        def costly_take(*args, _take=take, **kwargs) -> None:
            now[0] += COPY_SECONDS[rank]
            _take(*args, **kwargs)

        store.take = costly_take
    keep = guard.update_check._keep_sample

    def costly_keep() -> None:
        now[0] += CHECK_SECONDS[rank]
        keep()

    guard.update_check._keep_sample = costly_keep
    for step in range(1, 60):
        now[0] += STEP_SECONDS
        loss = 1.0 + 0.01 * (step % 3)
        guard.alarms(step, loss, 1.0)
        guard.before_update(step)
        guard.update_alarms(step)
        guard.observe(step, loss, 1.0)
    decided = {"copy_every": guard.copy_every, "update_check": guard.update_check.on}
    (out / f"rank{rank}.json").write_text(json.dumps(decided))
    leave_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
