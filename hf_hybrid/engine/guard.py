"""Safety around every predicted update: trust region, NaN guard, snapshot and rollback.

Applying a delta is all-or-nothing: every tensor is checked before any is written, so a refused
delta leaves the model exactly as it was. The arithmetic is fp32; for low-precision parameters the
rounding error of each write is carried to the next one (compensated summation), so updates smaller
than one bf16 ulp are not silently lost.

With sharded parameters (see `sharding.py`) the snapshot, the compensation and the writes are per shard,
and the whole-tensor quantities of the checks (the parameter's norm and rms, the clipped delta's norm,
"is any element non-finite") are shard sums added over the ranks, so every rank applies or refuses alike.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from .sharding import ShardGroup, local


@dataclass(frozen=True)
class ApplyResult:
    applied: bool
    clipped_tensors: int = 0
    reason: str = ""


def clip_to_trust_region(
    delta: torch.Tensor, param: torch.Tensor, max_delta: float
) -> tuple[torch.Tensor, bool]:
    """Cap a predicted delta per element and per tensor, relative to the parameter it moves.

    Per element: |delta_i| <= max_delta * max(|theta_i|, rms(theta)) (the rms floor lets entries at
    zero move, e.g. a LoRA B matrix). Per tensor: ||delta|| <= max_delta * ||theta||.
    """
    theta = param.detach().float()
    rms = theta.pow(2).mean().sqrt()
    element_cap = theta.abs().clamp_min(rms) * max_delta
    clipped = torch.maximum(torch.minimum(delta, element_cap), -element_cap)
    tensor_cap = max_delta * float(theta.norm())
    norm = float(clipped.norm())
    if norm > tensor_cap > 0:
        clipped = clipped * (tensor_cap / norm)
    changed = not torch.equal(clipped, delta)
    return clipped, changed


class ParameterGuard:
    """Owns the trainable parameters' safety state: snapshot, compensation buffers, delta application."""

    def __init__(
        self,
        params: Mapping[str, torch.Tensor],
        snapshot_device: str = "same",
        shards: ShardGroup | None = None,
    ) -> None:
        if snapshot_device not in ("same", "cpu"):
            raise ValueError(f"`snapshot_device` must be 'same' or 'cpu', got {snapshot_device!r}")
        self.params = dict(params)
        self.shards = shards or ShardGroup()
        self.snapshot_device = snapshot_device
        self.snapshot: dict[str, torch.Tensor] = {}
        self.compensation: dict[str, torch.Tensor] = {}

    @property
    def has_snapshot(self) -> bool:
        return bool(self.snapshot)

    def take_snapshot(self) -> None:
        """Copy the trainable parameters (once per predict phase; rollback returns here)."""
        for name, whole in self.params.items():
            p = local(whole)
            target = p.device if self.snapshot_device == "same" else torch.device("cpu")
            buf = self.snapshot.get(name)
            if buf is None or buf.device != target:
                buf = torch.empty_like(p, device=target)
                self.snapshot[name] = buf
            buf.copy_(p.detach())

    @torch.no_grad()
    def restore_snapshot(self) -> None:
        """Put the parameters back exactly as they were at the snapshot."""
        if not self.snapshot:
            raise RuntimeError("restore_snapshot() called with no snapshot taken")
        for name, p in self.params.items():
            local(p).copy_(self.snapshot[name])
        self.compensation.clear()

    def drop_snapshot(self) -> None:
        """Free the snapshot memory between predict phases."""
        self.snapshot.clear()

    @torch.no_grad()
    def apply(
        self, deltas: Mapping[str, torch.Tensor], max_delta: float
    ) -> tuple[ApplyResult, dict[str, torch.Tensor]]:
        """Apply predicted deltas within the trust region, or nothing at all.

        Returns the result and the deltas actually applied (after clipping), for the residuals.
        """
        unknown = set(deltas) - set(self.params)
        if unknown:
            return ApplyResult(False, reason=f"delta for unknown parameters {sorted(unknown)[:3]}"), {}
        if self.shards.sharded:
            return self._apply_sharded(deltas, max_delta)
        clipped_count = 0
        final: dict[str, torch.Tensor] = {}
        for name, delta in deltas.items():
            p = self.params[name]
            if delta.shape != p.shape:
                return ApplyResult(
                    False, reason=f"delta shape {tuple(delta.shape)} != {tuple(p.shape)} for {name}"
                ), {}
            delta = delta.to(device=p.device, dtype=torch.float32)
            if not bool(torch.isfinite(delta).all()):
                return ApplyResult(False, reason=f"non-finite predicted delta for {name}"), {}
            delta, clipped = clip_to_trust_region(delta, p, max_delta)
            clipped_count += int(clipped)
            if not bool(torch.isfinite(self._target(name, p, delta).to(p.dtype)).all()):
                return ApplyResult(False, reason=f"update would make {name} non-finite"), {}
            final[name] = delta
        for name, delta in final.items():
            p = self.params[name]
            target = self._target(name, p, delta)
            p.copy_(target)
            if p.dtype != torch.float32:
                self.compensation[name] = target - p.float()
        return ApplyResult(True, clipped_tensors=clipped_count), final

    def _apply_sharded(
        self, deltas: Mapping[str, torch.Tensor], max_delta: float
    ) -> tuple[ApplyResult, dict[str, torch.Tensor]]:
        """`apply` on this rank's shards, with `clip_to_trust_region`'s caps taken over whole tensors.

        Three all-reduces, each batched over all tensors (each needs the one before: the element cap
        needs the parameter's rms, the tensor cap the element-clipped delta's norm, the last check the
        final delta). A refusal names the first tensor, in the parameters' order, that any rank refused.
        """
        names = [name for name in self.params if name in deltas]  # the same order on every rank
        shards = {name: local(self.params[name]) for name in names}
        theta = {name: shards[name].detach().float() for name in names}
        wrong = {name: deltas[name].shape != shards[name].shape for name in names}
        delta = {
            name: deltas[name].to(device=theta[name].device, dtype=torch.float32)
            for name in names
            if not wrong[name]
        }
        stage = self.shards.sum(
            [theta[n].pow(2).sum() for n in names]
            + [float(wrong[n]) for n in names]
            + [float(not wrong[n] and not bool(torch.isfinite(delta[n]).all())) for n in names]
        )
        k = len(names)
        theta_sq, wrong_any, nonfinite_any = stage[:k], stage[k : 2 * k], stage[2 * k :]
        for name, bad_shape, bad_value in zip(names, wrong_any, nonfinite_any, strict=True):
            if bad_shape:
                return ApplyResult(False, reason=f"delta shape does not match the shard of {name}"), {}
            if bad_value:
                return ApplyResult(False, reason=f"non-finite predicted delta for {name}"), {}
        clipped: dict[str, torch.Tensor] = {}
        for name, sq in zip(names, theta_sq, strict=True):
            rms = math.sqrt(sq / max(self.params[name].numel(), 1))
            cap = theta[name].abs().clamp_min(rms) * max_delta
            clipped[name] = torch.maximum(torch.minimum(delta[name], cap), -cap)
        stage = self.shards.sum(
            [clipped[n].pow(2).sum() for n in names]
            + [float(not torch.equal(clipped[n], delta[n])) for n in names]
        )
        clipped_count = 0
        for name, sq, theta_sq_n, changed in zip(names, stage[:k], theta_sq, stage[k:], strict=True):
            norm, tensor_cap = math.sqrt(sq), max_delta * math.sqrt(theta_sq_n)
            scaled = norm > tensor_cap > 0
            if scaled:
                clipped[name] = clipped[name] * (tensor_cap / norm)
            clipped_count += int(scaled or changed > 0)
        targets = {name: self._target(name, shards[name], clipped[name]) for name in names}
        nonfinite = self.shards.sum(
            [float(not bool(torch.isfinite(targets[n].to(shards[n].dtype)).all())) for n in names]
        )
        for name, bad in zip(names, nonfinite, strict=True):
            if bad:
                return ApplyResult(False, reason=f"update would make {name} non-finite"), {}
        for name in names:
            p, target = shards[name], targets[name]
            p.copy_(target)
            if p.dtype != torch.float32:
                self.compensation[name] = target - p.float()
        return ApplyResult(True, clipped_tensors=clipped_count), clipped

    def _target(self, name: str, p: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """The fp32 value the parameter should take, with the carried rounding error of its last write."""
        target = p.detach().float() + delta
        carry = self.compensation.get(name)
        if carry is not None:
            target = target + carry
        return target

    def forget_compensation(self) -> None:
        """A real optimizer step rewrote the parameters; old rounding errors no longer apply."""
        self.compensation.clear()

    def state_dict(self) -> dict[str, dict[str, torch.Tensor]]:
        return {"snapshot": dict(self.snapshot), "compensation": dict(self.compensation)}

    def load_state_dict(self, state: Mapping[str, Mapping[str, torch.Tensor]]) -> None:
        """Restore a saved snapshot and carried rounding errors onto the parameters' devices."""
        snapshot, compensation = state["snapshot"], state["compensation"]
        for name, saved in (*snapshot.items(), *compensation.items()):
            if name not in self.params or saved.shape != local(self.params[name]).shape:
                raise ValueError(f"saved guard buffer {name!r} does not match a trainable parameter")
        shards = {n: local(p) for n, p in self.params.items()}
        device = {
            n: (p.device if self.snapshot_device == "same" else torch.device("cpu"))
            for n, p in shards.items()
        }
        self.snapshot = {n: t.to(device[n], dtype=shards[n].dtype).clone() for n, t in snapshot.items()}
        self.compensation = {
            n: t.to(shards[n].device, torch.float32).clone() for n, t in compensation.items()
        }

    def nbytes(self) -> int:
        return sum(
            t.numel() * t.element_size() for t in (*self.snapshot.values(), *self.compensation.values())
        )
