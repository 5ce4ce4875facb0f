"""The engine state's format: readable JSON and a flat dict of tensors, split and joined back; and
whether a saved state fits this configuration and these parameters.

Small state belongs where people can read it (`trainer_state.json`), tensors in a safetensors file; a
tensor in the nested state is replaced by `"@tensor:<flat name>"`, so the JSON says where it went.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from .config import EngineConfig

TENSOR_REF = "@tensor:"
FORMAT_VERSION = 2  # 2: engine v2 (typed predict phase, update tracker, counters)


def split_state(tree: Any, prefix: str = "") -> tuple[Any, dict[str, torch.Tensor]]:
    """(JSON-able tree, {flat name: tensor}); non-finite floats become strings JSON can hold."""
    tensors: dict[str, torch.Tensor] = {}

    def walk(node: Any, path: str) -> Any:
        if isinstance(node, torch.Tensor):
            tensors[path] = node.detach().contiguous()
            return TENSOR_REF + path
        if isinstance(node, dict):
            for key in node:
                if not isinstance(key, str) or "/" in key:
                    raise ValueError(f"state keys must be strings without '/', got {key!r} at {path!r}")
            return {key: walk(value, f"{path}/{key}" if path else key) for key, value in node.items()}
        if isinstance(node, list | tuple):
            return [walk(value, f"{path}/{i}") for i, value in enumerate(node)]
        if isinstance(node, float) and not math.isfinite(node):
            return repr(node)
        if node is None or isinstance(node, bool | int | float | str):
            return node
        raise TypeError(f"cannot store {type(node).__name__} at {path!r} in an engine state")

    return walk(tree, prefix), tensors


def join_state(tree: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """Inverse of `split_state`; a missing tensor is an error that names it."""

    def walk(node: Any) -> Any:
        if isinstance(node, str) and node.startswith(TENSOR_REF):
            name = node[len(TENSOR_REF) :]
            if name not in tensors:
                raise KeyError(
                    f"tensor {name!r} referenced by the engine state is missing from the tensor file"
                )
            return tensors[name]
        if isinstance(node, str) and node in ("nan", "inf", "-inf"):
            return float(node)
        if isinstance(node, dict):
            return {key: walk(value) for key, value in node.items()}
        if isinstance(node, list):
            return [walk(value) for value in node]
        return node

    return walk(tree)


def parameter_fingerprint(params: Mapping[str, torch.Tensor]) -> dict[str, list[int]]:
    return {name: list(p.shape) for name, p in params.items()}


def describe_sharding_mismatch(
    saved: Mapping[str, int] | None, current: Mapping[str, int] | None
) -> str | None:
    """Why a state saved under one sharding cannot be loaded under another (None: it can; unsharded is
    world size 1): another world size splits the parameters differently."""
    saved_size, current_size = (1 if s is None else int(s["world_size"]) for s in (saved, current))
    if saved_size != current_size:
        return (
            f"the hybrid engine state was saved with its parameters sharded over a world size of "
            f"{saved_size}, and this run has a world size of {current_size}: the per-rank engine state "
            "cannot be resharded. Resume on the same number of processes, or start the engine afresh "
            "(`hybrid_restart_engine=True`; with HybridEngine, build a new engine instead of loading)"
        )
    if saved is not None and current is not None and int(saved["rank"]) != int(current["rank"]):
        return (
            f"this hybrid engine state holds the shards of rank {saved['rank']}, and this process is rank "
            f"{current['rank']}: load each rank's own state file"
        )
    return None


def describe_unloadable(
    state: Mapping[str, Any],
    config: EngineConfig,
    params: Mapping[str, torch.Tensor],
    sharding: Mapping[str, int] | None,
) -> str | None:
    """Why a saved engine state cannot be loaded into this engine (None: it can)."""
    version = state.get("format_version")
    if version != FORMAT_VERSION:
        return (
            f"hybrid state format version {version!r} is not supported by this hf_hybrid "
            f"(supports {FORMAT_VERSION}); upgrade hf_hybrid or start the engine fresh"
        )
    return describe_sharding_mismatch(state.get("sharding"), sharding) or describe_mismatch(
        state["config"], state["parameters"], config, params
    )


def describe_mismatch(
    saved_config: Mapping[str, Any],
    saved_parameters: Mapping[str, list[int]],
    config: EngineConfig,
    params: Mapping[str, torch.Tensor],
    rename: Callable[[str], str] = str,
) -> str | None:
    """Why a saved state cannot be used with this configuration and parameters (None: it can)."""
    problem = config.describe_mismatch(saved_config, rename)
    if problem:
        return problem
    shapes = parameter_fingerprint(params)
    if dict(saved_parameters) == shapes:
        return None
    missing = sorted(set(saved_parameters) - set(shapes))[:3]
    extra = sorted(set(shapes) - set(saved_parameters))[:3]
    common = set(shapes) & set(saved_parameters)
    reshaped = sorted(k for k in common if list(saved_parameters[k]) != shapes[k])[:3]
    return (
        "trainable parameters differ from the checkpoint's: "
        f"only in checkpoint {missing}, only in model {extra}, different shapes {reshaped}"
    )
