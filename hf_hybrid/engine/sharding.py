"""Sharded trainable parameters (FSDP2's `DTensor`s): the one module that knows about them.

Every trainable parameter is a `DTensor` sharded on dim 0 over a 1-D mesh; the engine keeps everything
per shard and works on `local(p)`. What a decision needs of a whole tensor is a sum of per-shard scalars:
`ShardGroup.sum` adds a batch of them in one all-reduce, so every rank decides alike (at most four per
step). `local()` is called at every use, never cached: FSDP2 may replace a parameter's local tensor.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

if dist.is_available():
    from torch.distributed.tensor import DTensor, Shard
else:  # a torch build without distributed support has no sharded tensors
    DTensor = Shard = None


def is_sharded(tensor: torch.Tensor) -> bool:
    return DTensor is not None and isinstance(tensor, DTensor)


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of `tensor` (the tensor itself when it is not sharded)."""
    return tensor.to_local() if is_sharded(tensor) else tensor


class ShardGroup:
    """The ranks that share the trainable parameters' shards, and the scalar all-reduce over them.
    `of(params)` refuses a mix of sharded and whole tensors and placements other than `Shard(0)` on 1-D."""

    def __init__(self, mesh: Any = None) -> None:
        self.mesh = mesh
        self.group = None if mesh is None else mesh.get_group()
        self.world_size = 1 if mesh is None else mesh.size()
        self.rank = 0 if mesh is None else mesh.get_local_rank()
        self.device = torch.device("cpu") if mesh is None else _mesh_device(mesh)

    @property
    def sharded(self) -> bool:
        return self.mesh is not None

    @classmethod
    def of(cls, params: Mapping[str, torch.Tensor]) -> ShardGroup:
        sharded = {name: p for name, p in params.items() if is_sharded(p)}
        if not sharded:
            return cls()
        whole = sorted(set(params) - set(sharded))
        if whole:
            raise ValueError(
                "the trainable parameters mix sharded DTensors and whole tensors (e.g. "
                f"{whole[:3]}); shard them all (fully_shard the root module) or none"
            )
        mesh = next(iter(sharded.values())).device_mesh
        if any(p.device_mesh != mesh for p in sharded.values()):  # equal meshes: the same ranks
            raise ValueError("the trainable parameters are sharded over different device meshes")
        odd = sorted(name for name, p in sharded.items() if tuple(p.placements) != (Shard(0),))
        if mesh.ndim != 1 or odd:
            raise ValueError(
                "hf_hybrid supports parameters sharded on dim 0 over a 1-D mesh (FSDP2's fully_shard "
                f"default); got a {mesh.ndim}-D mesh and other placements for {odd[:3]}"
            )
        return cls(mesh)

    def sum(self, values: Sequence[float | torch.Tensor]) -> list[float]:
        """Each value summed over the ranks, in one all-reduce (float64); unchanged when not sharded."""
        if not self.sharded:
            return [float(v) for v in values]
        if not values:
            return []
        # stacked where the collective runs: no host round trip per value on a GPU
        batch = torch.stack(
            [torch.as_tensor(v, dtype=torch.float64, device=self.device).reshape(()) for v in values]
        )
        dist.all_reduce(batch, op=dist.ReduceOp.SUM, group=self.group)
        return batch.tolist()

    def any(self, flag: bool) -> bool:
        """True on every rank when `flag` is True on any."""
        return bool(flag) if not self.sharded else self.sum([float(flag)])[0] > 0

    def flat_range(self, param: torch.Tensor) -> tuple[int, int]:
        """[start, stop) of this rank's shard in the flattened whole tensor (`Shard(0)` splits the rows like
        `torch.chunk`; checked against the local shape)."""
        numel = param.numel()
        if not self.sharded or numel == 0:
            return 0, numel
        rows = param.shape[0]
        row_size = numel // rows
        chunk = math.ceil(rows / self.world_size)
        first, last = min(self.rank * chunk, rows), min((self.rank + 1) * chunk, rows)
        if local(param).shape[0] != last - first:
            raise ValueError(
                f"shard of shape {tuple(local(param).shape)} on rank {self.rank} is not the "
                f"torch.chunk split of {tuple(param.shape)} over {self.world_size} ranks"
            )
        return first * row_size, last * row_size

    def describe(self) -> dict[str, int] | None:
        """What a checkpoint records of the sharding (None: the parameters are whole)."""
        return {"world_size": self.world_size, "rank": self.rank} if self.sharded else None


def _mesh_device(mesh: Any) -> torch.device:
    """Where the all-reduced scalars must live for the mesh's backend (a GPU for NCCL)."""
    kind = mesh.device_type
    if kind == "cpu":
        return torch.device("cpu")
    module = getattr(torch, kind)
    return torch.device(kind, module.current_device())
