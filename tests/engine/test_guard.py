"""Tests for the trust region and the parameter guard."""

from __future__ import annotations

import math

import pytest
import torch

from hf_hybrid.engine.alarm import DivergenceLevel
from hf_hybrid.engine.guard import ParameterGuard, clip_to_trust_region


def _params(seed: int = 0, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {
        "a": torch.nn.Parameter(torch.randn(4, 3, generator=gen).to(dtype)),
        "b": torch.nn.Parameter(torch.randn(5, generator=gen).to(dtype)),
    }


def _clone(params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in params.items()}


def _assert_bitwise(params: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert params.keys() == expected.keys()
    for name, p in params.items():
        assert p.dtype == expected[name].dtype
        assert torch.equal(p.detach(), expected[name]), name


def _clip_every_element(delta: torch.Tensor, theta: torch.Tensor, max_delta: float) -> torch.Tensor:
    """The element caps applied to every element, without the shortcut for deltas under all of them."""
    rms = float(torch.linalg.vector_norm(theta)) / math.sqrt(theta.numel())
    cap = theta.abs().clamp_min(rms) * max_delta
    clipped = torch.maximum(torch.minimum(delta, cap), -cap)
    norm, tensor_cap = float(clipped.norm()), max_delta * float(theta.norm())
    return clipped * (tensor_cap / norm) if norm > tensor_cap > 0 else clipped


class TestTrustRegion:
    @pytest.mark.parametrize("scale", [1e-6, 1e-3, 0.049, 0.05, 0.051, 0.5, 10.0])
    def test_the_shortcut_under_every_cap_gives_what_capping_every_element_gives(self, scale: float) -> None:
        gen = torch.Generator().manual_seed(1)
        theta = torch.randn(64, 32, generator=gen)
        rms = float(torch.linalg.vector_norm(theta)) / math.sqrt(theta.numel())
        delta = torch.randn(64, 32, generator=gen)
        delta *= scale * rms / float(delta.abs().max())  # the largest element at `scale` * rms
        clipped, changed = clip_to_trust_region(delta, theta, 0.05)
        expected = _clip_every_element(delta, theta, 0.05)
        assert torch.equal(clipped, expected)
        assert changed == (not torch.equal(expected, delta))
        assert changed == (scale > 0.05)

    def test_a_delta_exactly_at_the_smallest_cap_is_untouched(self) -> None:
        theta = torch.tensor([4.0, 0.0, 0.0, 0.0])
        floor = torch.tensor(2.0) * 0.05  # max_delta * rms, in fp32 as the caps are computed
        delta = torch.tensor([0.0, float(floor), -float(floor), 0.0])
        clipped, changed = clip_to_trust_region(delta, theta, 0.05)
        assert clipped is delta and not changed
        bigger = torch.nextafter(delta, torch.full_like(delta, 1.0))
        assert clip_to_trust_region(bigger, theta, 0.05)[1]

    def test_small_delta_untouched(self) -> None:
        theta = torch.tensor([1.0, -2.0, 0.5, 3.0])
        delta = torch.tensor([0.01, -0.01, 0.002, 0.0])
        clipped, changed = clip_to_trust_region(delta, theta, 0.05)
        assert not changed
        assert torch.equal(clipped, delta)

    def test_per_element_cap_with_rms_floor(self) -> None:
        theta = torch.tensor([4.0, 0.0, 0.0, 0.0])  # rms = 2
        delta = torch.tensor([0.0, 10.0, 0.0, 0.0])
        clipped, changed = clip_to_trust_region(delta, theta, 0.1)
        assert changed
        # an entry at zero may move by max_delta * rms, not by 0
        torch.testing.assert_close(clipped, torch.tensor([0.0, 0.2, 0.0, 0.0]))

    def test_per_element_cap_uses_own_magnitude_when_larger(self) -> None:
        theta = torch.tensor([10.0, 0.1, 0.1, 0.1])
        rms = float(theta.pow(2).mean().sqrt())
        assert rms < 10.0
        clipped, _ = clip_to_trust_region(torch.tensor([-100.0, 0.0, 0.0, 0.0]), theta, 0.01)
        torch.testing.assert_close(clipped, torch.tensor([-0.1, 0.0, 0.0, 0.0]))

    def test_per_tensor_cap(self) -> None:
        theta = torch.tensor([1.0, 0.01, 0.01, 0.01, 0.01])
        max_delta = 0.1
        rms = float(theta.pow(2).mean().sqrt())
        # every element exactly at its own cap: only the tensor norm cap can bind
        delta = theta.abs().clamp_min(rms) * max_delta
        clipped, changed = clip_to_trust_region(delta, theta, max_delta)
        assert changed
        assert float(clipped.norm()) == pytest.approx(max_delta * float(theta.norm()), rel=1e-5)
        torch.testing.assert_close(clipped / clipped.norm(), delta / delta.norm())  # direction kept

    def test_huge_delta_bounded_both_ways(self) -> None:
        gen = torch.Generator().manual_seed(0)
        theta = torch.randn(100, generator=gen)
        delta = torch.randn(100, generator=gen) * 1e30
        clipped, changed = clip_to_trust_region(delta, theta, 0.05)
        assert changed and torch.isfinite(clipped).all()
        rms = theta.pow(2).mean().sqrt()
        assert bool((clipped.abs() <= theta.abs().clamp_min(rms) * 0.05 * (1 + 1e-6)).all())
        assert float(clipped.norm()) <= 0.05 * float(theta.norm()) * (1 + 1e-6)

    def test_all_zero_parameter_does_not_move(self) -> None:
        clipped, changed = clip_to_trust_region(torch.ones(3), torch.zeros(3), 0.05)
        assert changed and torch.equal(clipped, torch.zeros(3))

    def test_bf16_parameter(self) -> None:
        theta = torch.tensor([1.0, -1.0], dtype=torch.bfloat16)
        clipped, changed = clip_to_trust_region(torch.tensor([1.0, 0.01]), theta, 0.05)
        assert changed
        assert clipped.dtype == torch.float32
        torch.testing.assert_close(clipped, torch.tensor([0.05, 0.01]))


class TestApply:
    def test_applies_exactly(self) -> None:
        params = _params()
        before = _clone(params)
        deltas = {"a": torch.full((4, 3), 1e-3), "b": torch.full((5,), -1e-3)}
        guard = ParameterGuard(params)
        refused, applied = guard.apply(deltas, max_delta=0.5)
        assert refused is None and guard.counters["clipped_tensors"] == 0
        for name, p in params.items():
            assert torch.equal(applied[name], deltas[name])
            assert torch.equal(p.detach(), before[name] + deltas[name])
            assert p.grad is None

    def test_subset_of_parameters(self) -> None:
        params = _params()
        before = _clone(params)
        refused, applied = ParameterGuard(params).apply({"b": torch.full((5,), 1e-3)}, max_delta=0.5)
        assert refused is None and set(applied) == {"b"}
        assert torch.equal(params["a"].detach(), before["a"])

    def test_reports_clipping(self) -> None:
        params = _params()
        before = _clone(params)
        guard = ParameterGuard(params)
        refused, applied = guard.apply({"a": torch.full((4, 3), 1e3), "b": torch.zeros(5)}, max_delta=0.01)
        assert refused is None and guard.counters["clipped_tensors"] == 1
        assert float(applied["a"].norm()) <= 0.01 * float(before["a"].norm()) * 1.001
        assert torch.equal(params["a"].detach(), before["a"] + applied["a"])

    @pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
    def test_non_finite_in_second_tensor_leaves_first_untouched(self, bad: float) -> None:
        params = _params()
        before = _clone(params)
        b = torch.zeros(5)
        b[2] = bad
        refused, applied = ParameterGuard(params).apply(
            {"a": torch.full((4, 3), 1e-3), "b": b}, max_delta=0.5
        )
        assert refused.level is DivergenceLevel.CRITICAL
        assert "non-finite" in refused.reason and "b" in refused.reason
        assert applied == {}
        _assert_bitwise(params, before)

    def test_update_overflowing_the_dtype_refused(self) -> None:
        params = {
            "a": torch.nn.Parameter(torch.ones(2, dtype=torch.bfloat16)),
            "b": torch.nn.Parameter(torch.full((2,), 3e38, dtype=torch.bfloat16)),
        }
        before = _clone(params)
        guard = ParameterGuard(params)
        refused, _ = guard.apply({"a": torch.full((2,), 0.01), "b": torch.full((2,), 1e38)}, max_delta=0.5)
        assert refused is not None and "non-finite" in refused.reason
        _assert_bitwise(params, before)
        assert guard.compensation == {}

    def test_shape_mismatch_refused(self) -> None:
        params = _params()
        before = _clone(params)
        refused, applied = ParameterGuard(params).apply(
            {"a": torch.zeros(4, 3), "b": torch.zeros(4)}, max_delta=0.5
        )
        assert refused is not None and "shape" in refused.reason and applied == {}
        _assert_bitwise(params, before)

    def test_unknown_name_refused(self) -> None:
        params = _params()
        before = _clone(params)
        refused, applied = ParameterGuard(params).apply(
            {"a": torch.full((4, 3), 1e-3), "zzz": torch.zeros(1)}, max_delta=0.5
        )
        assert refused is not None and "unknown" in refused.reason and "zzz" in refused.reason
        assert applied == {}
        _assert_bitwise(params, before)


class TestSnapshot:
    @pytest.mark.parametrize("device", ["same", "cpu"])
    def test_restore_is_bit_exact(self, device: str) -> None:
        params = _params(dtype=torch.bfloat16)
        guard = ParameterGuard(params, snapshot_device=device)
        assert not guard.has_snapshot
        guard.take_snapshot()
        saved = _clone(params)
        assert guard.has_snapshot
        for _ in range(5):
            guard.apply({n: torch.full_like(p, 1e-3, dtype=torch.float32) for n, p in params.items()}, 0.5)
        with torch.no_grad():
            params["a"].mul_(3.0)
        assert not torch.equal(params["a"].detach(), saved["a"])
        guard.restore_snapshot()
        _assert_bitwise(params, saved)
        assert guard.compensation == {}
        assert all(t.device.type == "cpu" for t in guard.snapshot.values())

    def test_snapshot_is_a_copy(self) -> None:
        params = _params()
        guard = ParameterGuard(params)
        guard.take_snapshot()
        with torch.no_grad():
            params["b"].add_(1.0)
        assert not torch.equal(guard.snapshot["b"], params["b"].detach())
        assert guard.snapshot["b"].data_ptr() != params["b"].data_ptr()

    def test_retake_overwrites(self) -> None:
        params = _params()
        guard = ParameterGuard(params)
        guard.take_snapshot()
        with torch.no_grad():
            params["a"].add_(1.0)
        guard.take_snapshot()
        expected = _clone(params)
        with torch.no_grad():
            params["a"].add_(1.0)
        guard.restore_snapshot()
        _assert_bitwise(params, expected)

    def test_restore_without_snapshot(self) -> None:
        guard = ParameterGuard(_params())
        with pytest.raises(RuntimeError, match="no snapshot"):
            guard.restore_snapshot()
        guard.take_snapshot()
        guard.drop_snapshot()
        assert not guard.has_snapshot
        with pytest.raises(RuntimeError, match="no snapshot"):
            guard.restore_snapshot()

    def test_nbytes(self) -> None:
        params = _params()
        guard = ParameterGuard(params)
        assert guard.nbytes() == 0
        guard.take_snapshot()
        assert guard.nbytes() == (12 + 5) * 4

    def test_snapshot_device_validated(self) -> None:
        with pytest.raises(ValueError, match="`snapshot_device` must be 'same' or 'cpu'"):
            ParameterGuard(_params(), snapshot_device="cuda")


class TestLowPrecision:
    def test_sub_ulp_updates_accumulate_in_bf16(self) -> None:
        w = torch.nn.Parameter(torch.tensor([1.0, -1.0, 2.0, 0.75], dtype=torch.bfloat16))
        step = torch.tensor([1e-3, 1e-3, -1e-3, 1e-3])
        half_ulp = torch.tensor([2.0**-8, 2.0**-8, 2.0**-7, 2.0**-9])
        assert bool((step.abs() < half_ulp).all())
        naive = w.detach().clone()
        guard = ParameterGuard({"w": w})
        for _ in range(100):
            refused, _ = guard.apply({"w": step}, max_delta=0.05)
            assert refused is None
            naive.add_(step.to(torch.bfloat16))
        assert torch.equal(naive, torch.tensor([1.0, -1.0, 2.0, 0.75], dtype=torch.bfloat16))  # rounded away
        expected = torch.tensor([1.0, -1.0, 2.0, 0.75]) + 100 * step
        moved = w.detach().float() + guard.compensation["w"]
        torch.testing.assert_close(moved, expected, rtol=0, atol=1e-5)  # value + carry: exact sum
        ulp = torch.tensor([2.0**-7, 2.0**-7, 2.0**-7, 2.0**-7])
        assert bool(((w.detach().float() - expected).abs() <= ulp).all())  # the weight itself is within 1 ulp
        assert guard.compensation["w"].dtype == torch.float32

    def test_real_step_forgets_compensation(self) -> None:
        w = torch.nn.Parameter(torch.ones(3, dtype=torch.bfloat16))
        guard = ParameterGuard({"w": w})
        guard.apply({"w": torch.full((3,), 1e-3)}, max_delta=0.05)
        assert "w" in guard.compensation
        guard.forget_compensation()
        assert guard.compensation == {}

    def test_fp32_keeps_no_compensation(self) -> None:
        guard = ParameterGuard(_params())
        guard.apply({"a": torch.full((4, 3), 1e-3)}, max_delta=0.5)
        assert guard.compensation == {}
