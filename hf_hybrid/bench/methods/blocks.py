"""A model's transformer blocks (its largest `nn.ModuleList` of one class), whatever its family, and the
modules on their input side (registered before the blocks' branch: GPT-2's `wte`, BERT's `embeddings`).
"""

from __future__ import annotations

from torch import nn


class BlocksNotFound(ValueError):
    pass


def find_blocks(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """(qualified name, the list) of the model's transformer blocks, input side first."""
    best: tuple[int, str, nn.ModuleList] | None = None
    for name, module in model.named_modules():
        if not isinstance(module, nn.ModuleList) or len(module) < 2:
            continue
        if len({type(child) for child in module}) != 1:
            continue
        size = sum(p.numel() for p in module.parameters())
        if best is None or size > best[0]:
            best = (size, name, module)
    if best is None:
        raise BlocksNotFound(
            f"cannot find the transformer blocks of {type(model).__name__}: it has no nn.ModuleList of two "
            "or more modules of one class (the layers of GPT-2, BERT, Llama, OPT, ... models are one)"
        )
    return best[1], best[2]


def input_side(model: nn.Module, blocks_name: str) -> list[nn.Module]:
    """At each level from the root down to the blocks, the siblings registered before their branch."""
    out: list[nn.Module] = []
    module = model
    for part in blocks_name.split("."):
        for name, child in module.named_children():
            if name == part:
                break
            out.append(child)
        module = getattr(module, part)
    return out


def trainable(modules: list[nn.Module]) -> list[nn.Parameter]:
    seen: set[int] = set()
    out = []
    for module in modules:
        for p in module.parameters():
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                out.append(p)
    return out
