"""Where a copy of the training state lives, and how it is taken and put back.

The spike guard's two copies (`copy_schedule.py`) are each a `HostCopy`, a `NoCopy` or the caller's own
(the trainer's last checkpoint). Sharded parameters are copied and restored shard by shard (`local`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import torch

from .config import SpikeGuardConfig
from .sharding import local

__all__ = ["CopyStore", "HostCopy", "NoCopy", "Restorable", "host_copies"]


class Restorable(Protocol):
    """What a restore goes back to: the weights after `step` (None: nothing), measured by a swap."""

    step: int | None

    def restore(self, params: list[torch.Tensor], optimizer: Any) -> None: ...

    def available(self) -> str | None:
        """Why the copy cannot be restored now (None: it can)."""

    def swap(self, params: list[torch.Tensor]) -> bool:
        """Exchange the copy's weights with the live ones (twice restores both); False if it cannot."""


class CopyStore(Restorable, Protocol):
    """Where a copy of the training state lives (`step` None: nothing). `periodic`: taken every `every`
    clean steps (else at checkpoints); `persistent`: it outlives the process (a resumed run has it)."""

    periodic: bool
    persistent: bool

    def take(self, step: int, params: list[torch.Tensor], optimizer: Any) -> None: ...

    def reserve(self, params: list[torch.Tensor], optimizer: Any) -> None:
        """Hold the buffers of a copy of `params` and their optimizer state, without copying into them."""

    def clear(self) -> None:
        """Hold nothing (and free what was held)."""

    def nbytes(self) -> int: ...

    def tensors(self) -> Iterator[torch.Tensor]: ...


class HostCopy:
    """Parameters (and, unless `weights_only`, the optimizer state) at one step, in reused buffers on
    `device`. Weights only: a restore resets the optimizer's state, at a third of the memory with Adam."""

    periodic, persistent = True, False

    def __init__(self, device: str = "cpu", weights_only: bool = False) -> None:
        self.device = device
        self.weights_only = weights_only
        self.step: int | None = None
        self.params: list[torch.Tensor] = []
        self.state: list[dict[str, Any]] = []
        self._nbytes = 0  # counted when the buffers change, not at every read (the console reads it)

    def take(self, step: int, params: list[torch.Tensor], optimizer: Any) -> None:
        self._fill(params, optimizer, copy=True)
        self.step = step

    def reserve(self, params: list[torch.Tensor], optimizer: Any) -> None:
        self._fill(params, optimizer, copy=False)

    def _fill(self, params: list[torch.Tensor], optimizer: Any, copy: bool) -> None:
        self.params = [_copy_into(old, p, self.device, copy) for old, p in _pad(self.params, params)]
        if not self.weights_only:
            states = [optimizer.state.get(p, {}) for p in params]
            self.state = [
                {
                    k: _copy_into(old.get(k), v, self.device, copy) if torch.is_tensor(v) else _plain(v)
                    for k, v in state.items()
                }
                for old, state in ((o or {}, s) for o, s in _pad(self.state, states))
            ]
        self._nbytes = sum(t.numel() * t.element_size() for t in self.tensors())

    def clear(self) -> None:
        self.step, self.params, self.state, self._nbytes = None, [], [], 0

    def available(self) -> str | None:
        return None if self.step is not None else "no copy"

    @torch.no_grad()
    def restore(self, params: list[torch.Tensor], optimizer: Any) -> None:
        for buf, p in zip(self.params, params, strict=True):
            local(p).copy_(buf)
        if self.weights_only:
            for p in params:
                optimizer.state.pop(p, None)
            return
        for saved, p in zip(self.state, params, strict=True):
            _restore_state(optimizer, p, saved)

    @torch.no_grad()
    def swap(self, params: list[torch.Tensor]) -> bool:
        for buf, p in zip(self.params, params, strict=True):
            live = local(p).detach().clone()
            local(p).copy_(buf)
            buf.copy_(live)
        return True

    def nbytes(self) -> int:
        return self._nbytes

    def tensors(self) -> Iterator[torch.Tensor]:
        yield from self.params
        for state in self.state:
            yield from (v for v in state.values() if torch.is_tensor(v))


class NoCopy:
    """`storage="none"`: no copy is kept; the guard only skips bad batches."""

    periodic, persistent = False, False

    def __init__(self) -> None:
        self.step: int | None = None

    def take(self, step: int, params: list[torch.Tensor], optimizer: Any) -> None:
        """Nothing is kept."""

    def reserve(self, params: list[torch.Tensor], optimizer: Any) -> None:
        """Nothing is held."""

    def clear(self) -> None:
        self.step = None

    def restore(self, params: list[torch.Tensor], optimizer: Any) -> None:
        raise RuntimeError("a spike guard without copies cannot restore")

    def available(self) -> str | None:
        return "no copy is kept (hybrid_guard_storage=none)"

    def swap(self, params: list[torch.Tensor]) -> bool:
        return False

    def nbytes(self) -> int:
        return 0

    def tensors(self) -> Iterator[torch.Tensor]:
        yield from ()


def host_copies(config: SpikeGuardConfig) -> tuple[CopyStore, CopyStore]:
    """The two stores `config.storage` asks for, when the guard keeps them itself (not `checkpoint`)."""
    if config.storage in ("host", "weights"):
        weights_only = config.storage == "weights"
        return HostCopy(config.device, weights_only), HostCopy(config.device, weights_only)
    if config.storage == "none":
        return NoCopy(), NoCopy()
    raise ValueError(f"storage {config.storage!r} needs its copies from the caller (`copies=`)")


def _restore_state(optimizer: Any, p: torch.Tensor, saved: dict[str, Any]) -> None:
    """The optimizer's state for `p` made equal to `saved` (tensors copied in place where they fit)."""
    if not saved:
        optimizer.state.pop(p, None)
        return
    live = optimizer.state.get(p)
    if live is None:
        live = optimizer.state[p] = {}
    for key, value in saved.items():
        now = live.get(key)
        if torch.is_tensor(value) and torch.is_tensor(now) and local(now).shape == value.shape:
            local(now).copy_(value)
        elif torch.is_tensor(value):
            live[key] = value.to(p.device, copy=True)
        else:
            live[key] = _plain(value)
    for key in set(live) - set(saved):
        del live[key]


def _pad(old: list[Any], new: list[Any]) -> list[tuple[Any, Any]]:
    return [(old[i] if i < len(old) else None, item) for i, item in enumerate(new)]


def _plain(value: Any) -> Any:
    """A non-tensor state value (Adam's `step` in some optimizers, a flag): copied shallowly."""
    return list(value) if isinstance(value, list) else dict(value) if isinstance(value, dict) else value


def _copy_into(
    buf: torch.Tensor | None, tensor: torch.Tensor, device: str, copy: bool = True
) -> torch.Tensor:
    src = local(tensor).detach()
    target = torch.device("cpu") if device == "cpu" else src.device
    if buf is None or buf.shape != src.shape or buf.dtype != src.dtype or buf.device != target:
        pin = target.type == "cpu" and src.device.type == "cuda"
        buf = torch.empty(src.shape, dtype=src.dtype, device=target, pin_memory=pin)
    if copy:
        buf.copy_(src, non_blocking=buf.is_pinned())
    return buf
