"""Safety around every predicted update: trust region, NaN guard, snapshot and rollback.

Applying a delta is all-or-nothing (every tensor checked before any is written). The arithmetic is fp32
and, for low-precision parameters, each write's rounding error is carried to the next (compensated
summation), so updates under one bf16 ulp are not lost. Sharded, the whole-tensor quantities are shard
sums added over the ranks, so every rank applies or refuses alike.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from .accounting import StepCounters
from .alarm import Alarm, DivergenceLevel
from .sharding import ShardGroup, local
from .timing import PartTimer

Applied = tuple[Alarm | None, dict[str, torch.Tensor]]  # (why it was refused, or None; the deltas written)


def clip_to_trust_region(
    delta: torch.Tensor, param: torch.Tensor, max_delta: float
) -> tuple[torch.Tensor, bool]:
    """Cap a delta per element, |delta_i| <= max_delta * max(|theta_i|, rms(theta)) (the rms floor lets a
    LoRA B at zero move), and per tensor, ||delta|| <= max_delta * ||theta||; (capped delta, capped?)."""
    clipped, changed, _ = _clip(delta, param.detach().float(), max_delta, _peak(delta))
    return clipped, changed


def _peak(delta: torch.Tensor) -> float:
    """max |delta_i| (nan or inf when a value is not finite), one pass."""
    return float(torch.linalg.vector_norm(delta, ord=math.inf)) if delta.numel() else 0.0


def _clip(
    delta: torch.Tensor, theta: torch.Tensor, max_delta: float, peak: float
) -> tuple[torch.Tensor, bool, float]:
    """`clip_to_trust_region` given theta in fp32 and `_peak(delta)`; also returns ||theta||. A delta whose
    peak is under every cap's floor, max_delta * rms(theta), skips the three element-wise passes."""
    theta_norm = float(torch.linalg.vector_norm(theta)) if theta.numel() else 0.0
    rms = theta_norm / math.sqrt(max(theta.numel(), 1))
    floor = float(torch.tensor(rms, dtype=torch.float32) * max_delta)
    clipped = delta
    if not peak <= floor:  # some element may exceed its cap (or a value is not finite)
        cap = theta.abs().clamp_min_(rms).mul_(max_delta)
        clipped = torch.minimum(delta, cap)
        torch.maximum(clipped, cap.neg_(), out=clipped)
    tensor_cap = max_delta * theta_norm
    norm = float(torch.linalg.vector_norm(clipped)) if clipped.numel() else 0.0
    if norm > tensor_cap > 0:
        clipped = clipped * (tensor_cap / norm)
    changed = clipped is not delta and not torch.equal(clipped, delta)
    return clipped, changed, theta_norm


class ParameterGuard:
    """Owns the trainable parameters' safety state: snapshot, compensation buffers, delta application."""

    def __init__(
        self,
        params: Mapping[str, torch.Tensor],
        snapshot_device: str = "same",
        shards: ShardGroup | None = None,
        timer: PartTimer | None = None,
        counters: StepCounters | None = None,
    ) -> None:
        if snapshot_device not in ("same", "cpu"):
            raise ValueError(f"`snapshot_device` must be 'same' or 'cpu', got {snapshot_device!r}")
        self.params = dict(params)
        self.shards = shards or ShardGroup()
        self.timer = timer or PartTimer()
        self.counters = counters if counters is not None else StepCounters()
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
    def restore_snapshot(self) -> Mapping[str, torch.Tensor]:
        """Put the parameters back exactly as they were at the snapshot; returns the snapshot."""
        if not self.snapshot:
            raise RuntimeError("restore_snapshot() called with no snapshot taken")
        for name, p in self.params.items():
            local(p).copy_(self.snapshot[name])
        self.compensation.clear()
        return self.snapshot

    def drop_snapshot(self) -> None:
        """Free the snapshot memory between predict phases."""
        self.snapshot.clear()

    @torch.no_grad()
    def apply(self, deltas: Mapping[str, torch.Tensor], max_delta: float, scale: float = 1.0) -> Applied:
        """Apply predicted deltas, times `scale`, within the trust region, or nothing at all: (None, the
        deltas applied) or, refused, (a CRITICAL alarm that says why, {})."""
        unknown = set(deltas) - set(self.params)
        if unknown:
            return _refused(f"delta for unknown parameters {sorted(unknown)[:3]}")
        if self.shards.sharded:
            return self._apply_sharded(deltas, max_delta, scale)
        clipped_count = 0
        final: dict[str, torch.Tensor] = {}
        for name, delta in deltas.items():
            p = self.params[name]
            if delta.shape != p.shape:
                return _refused(f"delta shape {tuple(delta.shape)} != {tuple(p.shape)} for {name}")
            delta = delta.to(device=p.device, dtype=torch.float32) * scale
            peak = _peak(delta)
            if not math.isfinite(peak):
                return _refused(f"non-finite predicted delta for {name}")
            with self.timer.part("trust_region"):
                delta, clipped, theta_norm = _clip(delta, p.detach().float(), max_delta, peak)
            clipped_count += int(clipped)
            if not self._stays_finite(name, p, delta, theta_norm):
                return _refused(f"update would make {name} non-finite")
            final[name] = delta
        for name, delta in final.items():
            p = self.params[name]
            if p.dtype == torch.float32:  # no rounding to carry: the fp32 target, written in place
                p.add_(delta)
                continue
            target = self._target(name, p, delta)
            p.copy_(target)
            self.compensation[name] = target - p.float()
        self.counters.add("clipped_tensors", clipped_count)
        return None, final

    def _stays_finite(self, name: str, p: torch.Tensor, delta: torch.Tensor, theta_norm: float) -> bool:
        """Would writing `delta` keep `p` finite? A clipped target is within 2 ||theta|| (plus a carried
        rounding error): far below the dtype's max that settles it without a pass over the tensor."""
        if math.isfinite(theta_norm) and 4.0 * theta_norm < torch.finfo(p.dtype).max:
            return True
        return bool(torch.isfinite(self._target(name, p, delta).to(p.dtype)).all())

    def _apply_sharded(self, deltas: Mapping[str, torch.Tensor], max_delta: float, scale: float) -> Applied:
        """`apply` on this rank's shards, the caps over whole tensors: three all-reduces, each batched
        over all tensors (each needs the one before). A refusal names the first tensor any rank refused."""
        names = [name for name in self.params if name in deltas]  # the same order on every rank
        shards = {name: local(self.params[name]) for name in names}
        theta = {name: shards[name].detach().float() for name in names}
        wrong = {name: deltas[name].shape != shards[name].shape for name in names}
        delta = {
            name: deltas[name].to(device=theta[name].device, dtype=torch.float32) * scale
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
                return _refused(f"delta shape does not match the shard of {name}")
            if bad_value:
                return _refused(f"non-finite predicted delta for {name}")
        clipped: dict[str, torch.Tensor] = {}
        with self.timer.part("trust_region"):
            for name, sq in zip(names, theta_sq, strict=True):
                rms = math.sqrt(sq / max(self.params[name].numel(), 1))
                cap = theta[name].abs().clamp_min(rms) * max_delta
                clipped[name] = torch.maximum(torch.minimum(delta[name], cap), -cap)
            sums = [clipped[n].pow(2).sum() for n in names]
            sums += [float(not torch.equal(clipped[n], delta[n])) for n in names]
        stage = self.shards.sum(sums)
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
                return _refused(f"update would make {name} non-finite")
        for name in names:
            p, target = shards[name], targets[name]
            p.copy_(target)
            if p.dtype != torch.float32:
                self.compensation[name] = target - p.float()
        self.counters.add("clipped_tensors", clipped_count)
        return None, clipped

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

    def tensors(self) -> list[torch.Tensor]:
        """The snapshot's and the carried rounding errors' buffers."""
        return [*self.snapshot.values(), *self.compensation.values()]

    def buffer_counts(self) -> tuple[int, int]:
        """How many snapshot and compensation buffers exist (what changes when buffers come or go)."""
        return len(self.snapshot), len(self.compensation)

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
        return sum(t.numel() * t.element_size() for t in self.tensors())


def _refused(reason: str) -> Applied:
    return Alarm(DivergenceLevel.CRITICAL, reason), {}
