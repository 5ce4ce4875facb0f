"""TEST-ONLY shim: force accelerate's FSDP2 path on CPU (gloo), which accelerate 1.15 refuses there.

Never use this outside the tests; it is not part of hf_hybrid.

Why it is needed: `AcceleratorState.__init__` turns an FSDP plugin into `DistributedType.FSDP` only for
the multi-device GPU-like types (MULTI_GPU, MULTI_NPU, MULTI_XPU, ...). Several CPU processes are
MULTI_CPU, which is not in that list, so with `use_cpu=True` the plugin is silently dropped and the
Trainer trains plain DDP (`trainer.is_fsdp_enabled` is False). torch's `fully_shard` itself runs on CPU
with gloo, and so does accelerate's FSDP2 `prepare` once the state says FSDP.

What it does, right after `Trainer.create_accelerator_and_postprocess` built the accelerator, and only
when the processes are gloo CPU ranks (on GPUs accelerate enables FSDP itself and nothing is touched):
- `AcceleratorState.distributed_type` and `PartialState`'s shared `distributed_type` become FSDP (the
  accelerator and the Trainer read one or the other);
- `AcceleratorState.fsdp_plugin` is the plugin the Trainer built from `TrainingArguments.fsdp_config`
  (`args.fsdp_plugin_args`), exactly what accelerate would have stored on a GPU;
- `trainer.is_fsdp_enabled` is set, as the Trainer sets it from the plugin.
Then `accelerator.prepare` applies `fully_shard` (parameters become `DTensor`s sharded on dim 0), and
gradient clipping, the optimizer and checkpoints take accelerate's FSDP2 branches, as on GPUs.
"""

from __future__ import annotations

from typing import Any

from accelerate.state import PartialState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
from transformers import Trainer


def force_fsdp2(trainer: Trainer) -> bool:
    """Switch `trainer`'s freshly built accelerator to FSDP2 on gloo CPU ranks; True when it did."""
    state = trainer.accelerator.state
    plugin_args = trainer.args.fsdp_plugin_args
    if state.distributed_type != DistributedType.MULTI_CPU or plugin_args is None:
        return False
    if plugin_args.get("fsdp_version") != 2:
        raise ValueError("the shim forces FSDP2 only: set fsdp_config={'fsdp_version': 2, ...}")
    state.distributed_type = DistributedType.FSDP
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    state.fsdp_plugin = FullyShardedDataParallelPlugin(**plugin_args)
    trainer.is_fsdp_enabled = True
    return True


def with_fsdp2_on_cpu(trainer_cls: type[Trainer]) -> type[Trainer]:
    """`trainer_cls` whose accelerator is forced to FSDP2 on gloo CPU ranks (see the module docstring)."""

    class ForcedFSDP2(trainer_cls):  # type: ignore[misc, valid-type]
        forced_fsdp2 = False

        def create_accelerator_and_postprocess(self, *args: Any, **kwargs: Any) -> None:
            super().create_accelerator_and_postprocess(*args, **kwargs)
            self.forced_fsdp2 = force_fsdp2(self)

    ForcedFSDP2.__name__ = ForcedFSDP2.__qualname__ = f"ForcedFSDP2{trainer_cls.__name__}"
    return ForcedFSDP2
