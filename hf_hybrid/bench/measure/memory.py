"""What an object holds in memory, by walking its live object graph: every tensor storage it references
(once, by device) and the Python objects (`sys.getsizeof`); not what `exclude` holds, callables (a probe
closure leads back to the trainer) or modules.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class RetainedBytes:
    tensors: dict[str, int] = field(default_factory=dict)  # device -> bytes of tensor storage
    python: int = 0

    @property
    def total(self) -> int:
        return sum(self.tensors.values()) + self.python

    @property
    def host(self) -> int:
        return self.tensors.get("cpu", 0) + self.python

    @property
    def device(self) -> int:
        return sum(n for name, n in self.tensors.items() if name != "cpu")


def _storage_key(tensor: torch.Tensor) -> tuple[str, int]:
    return str(tensor.device), tensor.untyped_storage().data_ptr()


def retained_bytes(root: Any, exclude: Iterable[Any] = ()) -> RetainedBytes:
    out = RetainedBytes()
    excluded = {id(obj) for obj in exclude}
    excluded_storages = {_storage_key(tensor) for obj in exclude for tensor in _tensors_of(obj)}
    seen: set[int] = set()
    seen_storages: set[tuple[str, int]] = set()
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or id(obj) in excluded:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            key = _storage_key(obj)
            if key not in seen_storages and key not in excluded_storages:
                seen_storages.add(key)
                out.tensors[key[0]] = out.tensors.get(key[0], 0) + obj.untyped_storage().nbytes()
            continue
        is_code = isinstance(obj, types.ModuleType | types.FunctionType | types.MethodType | type)
        if (is_code or callable(obj)) and not isinstance(obj, torch.nn.Module):
            continue
        out.python += sys.getsizeof(obj)
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, list | tuple | set | frozenset) or type(obj).__name__ == "deque":
            stack.extend(obj)
        else:
            if hasattr(obj, "__dict__"):
                stack.append(vars(obj))
            for slot in getattr(type(obj), "__slots__", ()):
                if hasattr(obj, slot):
                    stack.append(getattr(obj, slot))
    return out


def _tensors_of(obj: Any) -> list[torch.Tensor]:
    """The tensors an excluded object owns (a module's parameters, an optimizer's state, ...)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, torch.nn.Module):
        return [*obj.parameters(), *obj.buffers()]
    if isinstance(obj, torch.optim.Optimizer) or hasattr(obj, "optimizer"):
        inner = getattr(obj, "optimizer", obj)
        inner = getattr(inner, "optimizer", inner)
        state = getattr(inner, "state", {})
        return [t for s in state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    if isinstance(obj, dict):
        return [t for t in obj.values() if isinstance(t, torch.Tensor)]
    return []


def engine_retained_bytes(engine: Any) -> RetainedBytes:
    """The hybrid engine's own memory: all but the model's parameters, the optimizer and the probe."""
    exclude = [engine.params, *engine.params.values(), engine.probe]
    optimizer = engine.optimizer
    while optimizer is not None:  # accelerate's wrapper, and the torch optimizer inside it
        exclude.append(optimizer)
        optimizer = getattr(optimizer, "optimizer", None)
    return retained_bytes(engine, exclude=[obj for obj in exclude if obj is not None])
