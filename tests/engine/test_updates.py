"""RealUpdateTracker and CoordinateSample: the real update, whole or on the sleeping engine's sample."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from hf_hybrid.engine.sample import CoordinateSample
from hf_hybrid.engine.updates import RealUpdateTracker


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 512), nn.Tanh(), nn.Linear(512, 8))


def _step(model: nn.Module, opt: torch.optim.Optimizer, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(32, 64, generator=gen)
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()


@pytest.mark.parametrize("sampled", [False, True])
def test_take_averages_the_update_over_unobserved_steps(sampled):
    model = _model()
    params = dict(model.named_parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sample = CoordinateSample({n: p.shape for n, p in params.items()}, seed=3) if sampled else None
    tracker = RealUpdateTracker(params, sample)
    start = {n: p.detach().clone() for n, p in params.items()}
    for i in range(8):
        _step(model, opt, i)
        if i < 7:
            tracker.skip()
    delta = tracker.take()
    for name, p in params.items():
        expected = (p.detach() - start[name]) / 8
        if sample is not None:
            expected = sample.gather(name, expected)
        assert delta[name].shape == expected.shape
        torch.testing.assert_close(delta[name], expected, rtol=1e-5, atol=1e-8)
    assert tracker.unobserved_steps == 0


def test_a_sampled_tracker_holds_a_small_share_of_the_bytes():
    params = dict(_model().named_parameters())
    full = RealUpdateTracker(params)
    sampled = RealUpdateTracker(params, CoordinateSample({n: p.shape for n, p in params.items()}, seed=0))
    assert full.nbytes() == sum(p.numel() * 4 for p in params.values())
    assert sampled.nbytes() < 0.005 * full.nbytes()


def test_the_sample_is_seeded_strided_and_capped():
    shapes = {"w": (384, 1536), "b": (384,), "tiny": (3,), "huge": (40_000_000,)}
    a, b, c = (
        CoordinateSample(shapes, seed=0),
        CoordinateSample(shapes, seed=0),
        CoordinateSample(shapes, seed=1),
    )
    assert a.layout == b.layout and a.layout != c.layout  # same seed, same coordinates (every rank)
    offset, stride, numel = a.layout["w"]
    assert stride == 401 and 0 <= offset < stride and numel == 384 * 1536
    assert a.count("w") == math.ceil((numel - offset) / stride)
    assert a.count("tiny") == 1 and a.count("huge") <= 65536
    t = torch.arange(384 * 1536, dtype=torch.float32).reshape(384, 1536)
    assert torch.equal(a.gather("w", t), t.reshape(-1)[offset::stride])
    assert 0.002 < CoordinateSample({"w": (384, 1536)}, seed=0).fraction < 0.003
