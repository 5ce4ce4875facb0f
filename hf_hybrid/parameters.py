"""The trainable parameters the engine works on, named as in the bare model.

The engine keys its state (predictor buffers, snapshots, checkpoints, telemetry) by parameter name, so
the names must not depend on how the model is wrapped for training: a run under FSDP2, activation
checkpointing or `torch.compile` must read and write the same checkpoint as a plain run. FSDP2's
`fully_shard` keeps the names (it swaps the module's class in place), but wrappers that hold the model
as a submodule insert a path component: `_fsdp_wrapped_module.` (FSDP1), `_checkpoint_wrapped_module.`
(torch's checkpoint_wrapper, which accelerate applies for FSDP activation checkpointing) and
`_orig_mod.` (`torch.compile`). Those components are removed here.
"""

from __future__ import annotations

from torch import Tensor, nn

WRAPPER_COMPONENTS = ("_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod")


def bare_name(name: str) -> str:
    """`name` without the path components that training wrappers insert."""
    return ".".join(part for part in name.split(".") if part not in WRAPPER_COMPONENTS)


def trainable_parameters(model: nn.Module) -> dict[str, Tensor]:
    """{bare name: parameter} of the parameters with `requires_grad` (sharded `DTensor`s stay as they
    are); two parameters that map to one bare name are an error, never a silent overwrite."""
    params: dict[str, Tensor] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        bare = bare_name(name)
        if bare in params:
            raise ValueError(
                f"two trainable parameters are both named {bare!r} once the wrapper prefixes "
                f"{WRAPPER_COMPONENTS} are removed (one is {name!r}); hf_hybrid keys its state by name"
            )
        params[bare] = param
    return params
