"""What runs where when scaling out, without launching processes: the names the engine keys its state
by under training wrappers, the fallback (and its message) for FSDP1 and DeepSpeed, and the per-rank
checkpoint entry's helpers. The two-rank FSDP2 runs are in tests/test_fsdp2_trainer.py."""

from __future__ import annotations

import json
import logging
import re
from types import SimpleNamespace

import pytest
from helpers import hybrid_trainer
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

from hf_hybrid.checkpoint import (
    HybridCheckpointError,
    last_complete_checkpoint,
    rank_file_names,
    rank_pair,
    sharding_problem,
)
from hf_hybrid.parameters import bare_name, trainable_parameters
from hf_hybrid.trainer import unsupported_distribution


def test_wrapper_path_components_are_removed_from_parameter_names():
    model = nn.Sequential(checkpoint_wrapper(nn.Linear(2, 2)), nn.Linear(2, 1))
    model[1].bias.requires_grad_(False)
    assert [n for n, _ in model.named_parameters()][0] == "0._checkpoint_wrapped_module.weight"
    params = trainable_parameters(model)
    assert list(params) == ["0.weight", "0.bias", "1.weight"]
    assert params["0.weight"] is model[0]._checkpoint_wrapped_module.weight
    assert bare_name("_orig_mod.model._fsdp_wrapped_module.layers.0.weight") == "model.layers.0.weight"


def test_two_parameters_with_one_bare_name_are_refused():
    model = nn.Module()
    model.lin = nn.Linear(1, 1, bias=False)
    model._orig_mod = nn.Module()
    model._orig_mod.lin = nn.Linear(1, 1, bias=False)
    with pytest.raises(ValueError, match=r"both named 'lin.weight'.*'_orig_mod.lin.weight'"):
        trainable_parameters(model)


@pytest.mark.parametrize(
    ("switch", "plugin", "expected"),
    [
        (
            "is_fsdp_enabled",
            SimpleNamespace(fsdp_version=1),
            r"FSDP1 \(fsdp_version: 1\).*set fsdp_version: 2",
        ),
        ("is_deepspeed_enabled", None, r"DeepSpeed \(every ZeRO stage\).*use FSDP2"),
    ],
)
def test_unsupported_set_ups_train_plainly_and_say_what_is_unsupported(
    tmp_path, monkeypatch, caplog, switch, plugin, expected
):
    trainer = hybrid_trainer(tmp_path, max_steps=2)
    monkeypatch.setattr(trainer, switch, True)
    monkeypatch.setattr(trainer.accelerator.state, "fsdp_plugin", plugin, raising=False)
    with caplog.at_level(logging.WARNING, logger="hf_hybrid.trainer"):
        trainer._start_engine(trainer.model)
    assert trainer.engine is None
    (message,) = [r.getMessage() for r in caplog.records if "predict phases are off" in r.getMessage()]
    assert re.search(expected, message), message
    assert "trains exactly like the plain Trainer" in message


def test_fsdp2_is_supported(tmp_path, monkeypatch):
    trainer = hybrid_trainer(tmp_path, max_steps=2)
    monkeypatch.setattr(trainer, "is_fsdp_enabled", True)
    monkeypatch.setattr(
        trainer.accelerator.state, "fsdp_plugin", SimpleNamespace(fsdp_version=2), raising=False
    )
    assert unsupported_distribution(trainer) is None
    assert trainer._shard_world_size() == trainer.accelerator.num_processes


def _sharded_entry(world_size: int) -> dict:
    ranks = [{**rank_file_names(r), "sha256": {"tensors": None, "state": None}} for r in range(world_size)]
    return {"format_version": 2, "sharding": {"world_size": world_size}, "ranks": ranks, "summary": {}}


def test_each_rank_reads_its_own_pair_and_another_world_size_is_named():
    entry = _sharded_entry(2)
    assert rank_pair(entry, 1) == {"format_version": 2, **entry["ranks"][1]}
    unsharded = {"format_version": 2, "tensor_file": "hybrid_state.safetensors"}
    assert rank_pair(unsharded, 1) is unsharded
    assert sharding_problem(entry, 2) is None and sharding_problem(unsharded, 1) is None
    problem = sharding_problem(entry, 4)
    assert (
        "world size of 2" in problem and "world size of 4" in problem and "hybrid_restart_engine" in problem
    )
    assert "world size of 1" in sharding_problem(_sharded_entry(3), 1)
    with pytest.raises(HybridCheckpointError, match="no files for rank 2"):
        rank_pair(entry, 2)


def test_a_checkpoint_missing_one_ranks_file_is_not_complete(tmp_path, caplog):
    folder = tmp_path / "checkpoint-5"
    folder.mkdir()
    state = {
        "stateful_callbacks": {"HybridStateCallback": {"attributes": {"engine_state": _sharded_entry(2)}}}
    }
    (folder / "trainer_state.json").write_text(json.dumps(state))
    for name in (*rank_file_names(0).values(), rank_file_names(1)["state_file"]):
        (folder / name).write_bytes(b"x")
    with pytest.raises(HybridCheckpointError, match="checkpoint-5 lacks hybrid_state_rank1.safetensors"):
        last_complete_checkpoint(tmp_path)
    (folder / rank_file_names(1)["tensor_file"]).write_bytes(b"x")
    assert last_complete_checkpoint(tmp_path) == str(folder)
