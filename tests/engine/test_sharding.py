"""sharding.py and what depends on it, in one process: no collective runs without sharded parameters."""

from __future__ import annotations

import pytest
import torch

from hf_hybrid.engine.sample import CoordinateSample
from hf_hybrid.engine.sharding import ShardGroup, local
from hf_hybrid.engine.state import describe_sharding_mismatch


def test_whole_tensors_need_no_group_and_sums_pass_through():
    group = ShardGroup.of({"w": torch.zeros(3, 2)})
    assert not group.sharded and group.describe() is None
    assert group.sum([torch.tensor(1.5), 2]) == [1.5, 2.0]
    assert group.any(True) and not group.any(False)
    t = torch.ones(2)
    assert local(t) is t
    assert group.flat_range(torch.zeros(3, 2)) == (0, 6)


@pytest.mark.parametrize("rows", [255, 7, 1])
@pytest.mark.parametrize("world", [2, 3])
def test_the_shards_samples_are_the_whole_tensors_sample_split_by_rows(rows, world):
    """The sleeping engine's sums over the ranks' samples are sums over the one-process sample."""
    shape = (rows, 1000)
    whole = torch.arange(rows * 1000, dtype=torch.float32).reshape(shape)
    one = CoordinateSample({"w": shape}, seed=4).gather("w", whole)
    chunks = torch.chunk(whole, world)
    start, parts = 0, []
    for rank in range(world):
        shard = chunks[rank] if rank < len(chunks) else whole[:0]
        stop = start + shard.numel()
        sample = CoordinateSample({"w": shape}, seed=4, ranges={"w": (start, stop)})
        part = sample.gather("w", shard)
        assert part.numel() == sample.count("w")
        parts.append(part)
        start = stop
    assert torch.equal(torch.cat(parts), one)


def test_a_state_from_another_world_size_or_rank_is_refused():
    assert describe_sharding_mismatch(None, None) is None
    assert describe_sharding_mismatch({"world_size": 2, "rank": 1}, {"world_size": 2, "rank": 1}) is None
    fewer = describe_sharding_mismatch({"world_size": 4, "rank": 0}, {"world_size": 2, "rank": 0})
    assert "world size of 4" in fewer and "world size of 2" in fewer and "hybrid_restart_engine" in fewer
    assert "world size of 1" in describe_sharding_mismatch(None, {"world_size": 2, "rank": 0})
    assert "rank 1" in describe_sharding_mismatch({"world_size": 2, "rank": 1}, {"world_size": 2, "rank": 0})
