"""Tests for the weight-delta predictors."""

from __future__ import annotations

import math
from collections.abc import Mapping

import pytest
import torch

from hf_hybrid.engine.predictor import (
    DeltaPredictor,
    EMAPredictor,
    NullPredictor,
    available_predictors,
    build_predictor,
    cosine,
    delta_dot_products,
    register_predictor,
    resolve_predictor_name,
    unregister_predictor,
)

SHAPES = {"layer.weight": (6, 5), "layer.bias": (6,)}


def _rel_err(pred: torch.Tensor, target: torch.Tensor) -> float:
    return float((pred - target).norm() / target.norm())


def _random_deltas(seed: int, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {name: torch.randn(shape, generator=gen).to(dtype) for name, shape in SHAPES.items()}


def _assert_same(a: Mapping[str, torch.Tensor] | None, b: Mapping[str, torch.Tensor] | None) -> None:
    assert a is not None and b is not None
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


class TestRegistry:
    def test_builtins_registered(self) -> None:
        assert available_predictors() == ["adam", "ema", "null"]
        assert isinstance(build_predictor("null"), NullPredictor)
        assert isinstance(build_predictor("ema", beta=0.5), EMAPredictor)
        assert build_predictor("ema", decay=0.5).decay == 0.5

    def test_unknown_name_lists_available(self) -> None:
        with pytest.raises(
            ValueError, match=r"unknown predictor 'nope'; available: \[.*'adam'.*'ema'.*'null'"
        ):
            build_predictor("nope")

    def test_register_custom(self) -> None:
        class Constant(NullPredictor):
            pass

        assert register_predictor("test-constant", Constant) is Constant
        try:
            assert Constant.name == "test-constant"
            assert "test-constant" in available_predictors()
            assert isinstance(build_predictor("test-constant"), Constant)
            register_predictor("test-constant", Constant)  # the same class again is a no-op
        finally:
            unregister_predictor("test-constant")
        assert "test-constant" not in available_predictors()

    @pytest.mark.parametrize("name", ["ema", "null", "adam"])
    def test_shadowing_a_builtin_is_refused(self, name: str) -> None:
        class Impostor(EMAPredictor):
            pass

        with pytest.raises(
            ValueError, match=rf"'{name}' is already a registered built-in predictor.*override=True"
        ):
            register_predictor(name, Impostor)
        assert build_predictor("ema").__class__ is EMAPredictor

    def test_override_replaces_and_builtins_cannot_be_unregistered(self) -> None:
        class Shadow(EMAPredictor):
            pass

        register_predictor("ema", Shadow, override=True)
        try:
            assert type(build_predictor("ema")) is Shadow
        finally:
            register_predictor("ema", EMAPredictor, override=True)
        assert type(build_predictor("ema")) is EMAPredictor
        with pytest.raises(ValueError, match="built-in"):
            unregister_predictor("ema")

    @pytest.mark.parametrize(
        ("name", "cls", "error", "match"),
        [
            ("x", dict, TypeError, "needs a DeltaPredictor subclass"),
            ("x", NullPredictor(), TypeError, "needs a DeltaPredictor subclass"),
            ("auto", NullPredictor, ValueError, "other than 'auto'"),
            ("", NullPredictor, ValueError, "non-empty"),
            ("other-name", NullPredictor, ValueError, "NullPredictor.name is 'null'"),
        ],
    )
    def test_bad_registrations_are_refused(self, name, cls, error, match) -> None:
        with pytest.raises(error, match=match):
            register_predictor(name, cls)

    def test_interface_is_abstract(self) -> None:
        with pytest.raises(TypeError):
            DeltaPredictor()  # type: ignore[abstract]


class TestNull:
    def test_predicts_nothing(self) -> None:
        p = NullPredictor()
        assert p.predict(1) is None
        p.observe(_random_deltas(0))
        assert p.observed == 1
        assert p.predict(3) is None
        assert p.nbytes() == 0
        p.reset()
        assert p.observed == 0

    def test_state_round_trip(self) -> None:
        p = NullPredictor()
        p.observe(_random_deltas(0))
        q = NullPredictor()
        q.load_state_dict(p.state_dict())
        assert q.observed == 1


class TestEMA:
    @pytest.mark.parametrize(("beta", "decay"), [(0.5, 1.0), (0.9, 0.8), (0.0, 0.5)])
    def test_constant_stream(self, beta: float, decay: float) -> None:
        p = EMAPredictor(beta=beta, decay=decay)
        delta = _random_deltas(1)
        for n in range(1, 6):
            p.observe(delta)
            for k in (1, 2, 5):
                pred = p.predict(k)
                assert pred is not None
                for name, d in delta.items():
                    # bias correction makes the estimate exact from the first observation on
                    torch.testing.assert_close(pred[name], d * decay**k, rtol=1e-5, atol=1e-7)
            assert p.observed == n

    def test_tracks_recent_updates(self) -> None:
        p = EMAPredictor(beta=0.5, decay=1.0)
        a, b = _random_deltas(1), _random_deltas(2)
        p.observe(a)
        p.observe(b)
        pred = p.predict(1)
        assert pred is not None
        # ema = 0.25 a + 0.5 b (after 0.5 a), bias correction 1 - 0.25
        expected = (0.25 * a["layer.bias"] + 0.5 * b["layer.bias"]) / 0.75
        torch.testing.assert_close(pred["layer.bias"], expected)

    def test_no_prediction_before_data(self) -> None:
        assert EMAPredictor().predict(1) is None

    def test_fp32_buffers_for_bf16_deltas(self) -> None:
        p = EMAPredictor(beta=0.9, decay=1.0)
        tiny = {"w": torch.full((4,), 1e-3, dtype=torch.bfloat16)}
        for _ in range(3):
            p.observe(tiny)
        assert all(t.dtype == torch.float32 for t in p.tensors().values())
        pred = p.predict(1)
        assert pred is not None and pred["w"].dtype == torch.float32
        torch.testing.assert_close(pred["w"], tiny["w"].float(), rtol=1e-5, atol=0)

    def test_state_round_trip_same_prediction(self) -> None:
        p = EMAPredictor(beta=0.7, decay=0.9)
        for seed in range(4):
            p.observe(_random_deltas(seed))
        q = EMAPredictor(beta=0.7, decay=0.9)
        q.load_state_dict(p.state_dict())
        _assert_same(p.predict(3), q.predict(3))
        assert q.observed == 4
        # the loaded buffers are copies, not aliases
        p.observe(_random_deltas(9))
        assert not torch.equal(p.predict(1)["layer.bias"], q.predict(1)["layer.bias"])  # type: ignore[index]

    def test_state_for_other_predictor_refused(self) -> None:
        with pytest.raises(ValueError, match="predictor state is for 'null'"):
            EMAPredictor().load_state_dict(NullPredictor().state_dict())

    def test_nbytes_and_reset(self) -> None:
        p = EMAPredictor()
        p.observe(_random_deltas(0))
        assert p.nbytes() == (30 + 6) * 4
        p.reset()
        assert p.observed == 0 and p.nbytes() == 0 and p.predict(1) is None

    @pytest.mark.parametrize(("kwargs", "match"), [({"beta": 1.0}, "beta"), ({"decay": 0.0}, "decay")])
    def test_validation(self, kwargs: dict[str, float], match: str) -> None:
        with pytest.raises(ValueError, match=match):
            EMAPredictor(**kwargs)


class TestDotProducts:
    def test_matches_float64_sums_over_tensors(self) -> None:
        real = _random_deltas(0)
        pred = {name: 2.0 * t for name, t in real.items()}
        pd, pp, dd = delta_dot_products(pred, real)
        expected_dd = sum(float((t.double() ** 2).sum()) for t in real.values())
        assert dd == pytest.approx(expected_dd, rel=1e-6)  # fp32 dot products per tensor
        assert pd == pytest.approx(2 * expected_dd, rel=1e-6)
        assert pp == pytest.approx(4 * expected_dd, rel=1e-6)
        assert cosine(pd, pp, dd) == pytest.approx(1.0)

    def test_products_that_overflow_fp32_are_redone_in_float64(self) -> None:
        real = _random_deltas(0)
        huge = {name: torch.full_like(t, 1e30) for name, t in real.items()}
        pd, pp, dd = delta_dot_products(huge, real)
        expected_pp = sum(t.numel() * 1e60 for t in real.values())
        assert math.isfinite(pp) and pp == pytest.approx(expected_pp, rel=1e-6)
        assert math.isfinite(pd)

    def test_missing_prediction_counts_as_zero(self) -> None:
        real = _random_deltas(0)
        pd, pp, dd = delta_dot_products(None, real)
        assert pd == 0.0 and pp == 0.0 and dd > 0
        partial = {"layer.bias": -real["layer.bias"]}
        pd, pp, _ = delta_dot_products(partial, real)
        assert pd == pytest.approx(-pp)
        assert cosine(pd, pp, dd) < 0

    def test_empty(self) -> None:
        assert delta_dot_products(None, {}) == (0.0, 0.0, 0.0)
        assert cosine(1.0, 0.0, 1.0) == 0.0
        assert math.isclose(cosine(-1.0, 1.0, 1.0), -1.0)


class TestAdamReplay:
    @staticmethod
    def _trained(optimizer_cls, weight_decay):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
        optimizer = optimizer_cls(model.parameters(), lr=1e-2, weight_decay=weight_decay)
        x, y = torch.randn(16, 4), torch.randn(16, 2)
        for _ in range(5):
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
        return model, optimizer

    @pytest.mark.parametrize(
        ("optimizer_cls", "weight_decay"), [(torch.optim.AdamW, 0.1), (torch.optim.Adam, 0.0)]
    )
    def test_predicts_what_the_optimizer_does_with_zero_gradients(self, optimizer_cls, weight_decay):
        import copy

        model, optimizer = self._trained(optimizer_cls, weight_decay)
        twin = copy.deepcopy(model)
        twin_optimizer = optimizer_cls(twin.parameters(), lr=1e-2, weight_decay=weight_decay)
        twin_optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))
        params = dict(model.named_parameters())
        predictor = build_predictor("adam", params=params, optimizer=optimizer)
        for k in (1, 2, 3):  # as the engine does: each prediction from the weights the previous one left
            predicted = predictor.predict(k)
            assert predicted is not None and predicted.keys() == params.keys()
            with torch.no_grad():
                for name, p in params.items():
                    p.add_(predicted[name])
            for p in twin.parameters():
                p.grad = torch.zeros_like(p)
            twin_optimizer.step()
            for name, p in twin.named_parameters():
                torch.testing.assert_close(params[name].detach(), p.detach(), rtol=1e-5, atol=1e-7)

    def test_keeps_no_buffer_and_refuses_other_optimizers(self):
        model, optimizer = self._trained(torch.optim.AdamW, 0.0)
        predictor = build_predictor("adam", params=dict(model.named_parameters()), optimizer=optimizer)
        assert predictor.nbytes() == 0
        sgd = torch.optim.SGD(model.parameters(), lr=0.1)
        with pytest.raises(ValueError, match=r"maximize\); the optimizer is torch.optim.sgd.SGD"):
            build_predictor("adam", params=dict(model.named_parameters()), optimizer=sgd)
        with pytest.raises(ValueError, match="needs the optimizer"):
            build_predictor("adam")

    def test_auto_takes_the_replay_only_where_it_is_exact(self):
        model = torch.nn.Linear(3, 2)
        params = list(model.parameters())
        assert resolve_predictor_name("auto", torch.optim.AdamW(params)) == "adam"
        assert resolve_predictor_name("auto", torch.optim.Adam(params, fused=False)) == "adam"
        assert resolve_predictor_name("auto", torch.optim.AdamW(params, amsgrad=True)) == "ema"
        assert resolve_predictor_name("auto", torch.optim.Adam(params, maximize=True)) == "ema"
        assert resolve_predictor_name("auto", torch.optim.SGD(params, lr=0.1)) == "ema"
        assert resolve_predictor_name("auto", None) == "ema"
        assert resolve_predictor_name("null", torch.optim.AdamW(params)) == "null"
