"""Tests for residuals, the residual store and the corrector."""

from __future__ import annotations

import json
import math

import pytest
import torch

from hf_hybrid.engine.predictor import delta_dot_products
from hf_hybrid.engine.residuals import Corrector, Residual, ResidualStore


def _residual(pred_factor: float, step: int = 0, seed: int = 0, phase: str = "full", **kw: float) -> Residual:
    """Residual of a prediction `pred_factor * d` (plus nothing else) against a random real update d."""
    d = {"w": torch.randn(50, generator=torch.Generator().manual_seed(seed))}
    p = {"w": pred_factor * d["w"]}
    return Residual(step, phase, 1, *delta_dot_products(p, d), **kw)  # type: ignore[arg-type]


class TestResidual:
    def test_skill_formula(self) -> None:
        assert _residual(1.0).skill(1.0) == pytest.approx(1.0)
        assert _residual(0.0).skill(1.0) == pytest.approx(0.0)
        assert _residual(-1.0).skill(1.0) == pytest.approx(-3.0)
        assert _residual(2.0).skill(1.0) == pytest.approx(0.0)  # ||2d - d|| = ||d||
        assert _residual(2.0).skill(0.5) == pytest.approx(1.0)  # the scale fixes the overshoot
        assert _residual(0.5).skill(1.0) == pytest.approx(0.75)

    def test_skill_matches_direct_computation(self) -> None:
        gen = torch.Generator().manual_seed(3)
        d, p = torch.randn(2, 40, generator=gen)
        r = Residual(0, "full", 1, *delta_dot_products({"w": p}, {"w": d}))
        for scale in (0.0, 0.3, 1.0):
            direct = 1.0 - float(((scale * p - d) ** 2).sum() / (d**2).sum())
            assert r.skill(scale) == pytest.approx(direct, rel=1e-6, abs=1e-9)

    def test_zero_real_update(self) -> None:
        r = Residual(0, "full", 1, pd=0.0, pp=1.0, dd=0.0)
        assert r.skill(1.0) == 0.0
        assert r.norm_ratio == 0.0
        assert r.cosine == 0.0

    def test_cosine_and_norm_ratio(self) -> None:
        r = _residual(-3.0)
        assert r.cosine == pytest.approx(-1.0)
        assert r.norm_ratio == pytest.approx(3.0)
        assert _residual(0.0).cosine == 0.0
        orth = Residual(0, "full", 1, pd=0.0, pp=4.0, dd=1.0)
        assert orth.cosine == 0.0 and orth.norm_ratio == pytest.approx(2.0)

    def test_loss_error(self) -> None:
        assert Residual(0, "correct", 1, 0, 0, 1, loss_actual=2.5, loss_predicted=2.0).loss_error == 0.5
        assert Residual(0, "correct", 1, 0, 0, 1, loss_actual=2.5).loss_error is None


class TestResidualStore:
    def test_bounded(self) -> None:
        store = ResidualStore(capacity=4)
        for i in range(10):
            store.add(_residual(1.0, step=i))
        assert len(store) == 4
        assert store.total == 10
        assert [r.step for r in store.recent()] == [6, 7, 8, 9]
        assert [r.step for r in store.recent(2)] == [8, 9]

    def test_recent_by_phase(self) -> None:
        store = ResidualStore()
        for i, phase in enumerate(["full", "correct", "full", "correct", "full"]):
            store.add(_residual(1.0, step=i, phase=phase))
        assert [r.step for r in store.recent(phase="correct")] == [1, 3]
        assert [r.step for r in store.recent(1, phase="full")] == [4]

    def test_capacity_validated(self) -> None:
        with pytest.raises(ValueError, match="`capacity` must be >= 1"):
            ResidualStore(0)

    def test_state_round_trip(self) -> None:
        store = ResidualStore(capacity=3)
        for i in range(5):
            store.add(_residual(0.5 * i, step=i, loss_actual=1.0 + i, loss_predicted=1.0))
        state = json.loads(json.dumps(store.state_dict()))
        other = ResidualStore(capacity=3)
        other.load_state_dict(state)
        assert other.recent() == store.recent()
        assert other.total == 5
        other.add(_residual(1.0, step=99))
        assert len(other) == 3  # still bounded after loading


class TestCorrector:
    def test_converges_to_least_squares_multiplier(self) -> None:
        corrector = Corrector(rate=0.2)
        assert corrector.scale == 1.0
        for seed in range(60):
            corrector.update(_residual(2.0, seed=seed))
        assert corrector.scale == pytest.approx(0.5, abs=1e-4)

    def test_partial_rate_steps_towards_target(self) -> None:
        corrector = Corrector(rate=0.25)
        corrector.update(_residual(2.0))
        assert corrector.scale == pytest.approx(1.0 + 0.25 * (0.5 - 1.0))

    def test_opposite_predictor_clamped_at_zero(self) -> None:
        corrector = Corrector(rate=0.5)
        for seed in range(40):
            corrector.update(_residual(-1.0, seed=seed))
            assert corrector.scale >= 0.0
        assert corrector.scale == pytest.approx(0.0, abs=1e-9)

    def test_undershooting_predictor_capped_at_max_scale(self) -> None:
        corrector = Corrector(rate=1.0, max_scale=1.5)
        corrector.update(_residual(0.25))
        assert corrector.scale == pytest.approx(1.5)

    def test_empty_or_degenerate_prediction_ignored(self) -> None:
        corrector = Corrector()
        corrector.update(_residual(0.0))
        corrector.update(Residual(0, "full", 1, pd=math.nan, pp=1.0, dd=1.0))
        corrector.update(Residual(0, "full", 1, pd=math.inf, pp=1.0, dd=1.0))
        assert corrector.scale == 1.0

    def test_penalize_halves(self) -> None:
        corrector = Corrector()
        corrector.penalize()
        corrector.penalize()
        assert corrector.scale == 0.25
        assert corrector.rollbacks == 2

    def test_confidence(self) -> None:
        store = ResidualStore()
        corrector = Corrector(window=4)
        assert corrector.confidence(store) == 0.0  # no evidence, no confidence
        for seed in range(4):
            store.add(_residual(1.0, seed=seed))
        assert corrector.confidence(store) == pytest.approx(1.0)
        for seed in range(4):
            store.add(_residual(-1.0, seed=seed))
        assert corrector.confidence(store) == 0.0  # skill -3 clamped to 0
        store.add(_residual(0.5))
        store.add(_residual(0.5))
        # window of 4: two opposite (-3) and two half-size (0.75) predictions -> mean below 0
        assert corrector.confidence(store) == 0.0
        for _ in range(2):
            store.add(_residual(0.5))
        assert corrector.confidence(store) == pytest.approx(0.75)

    def test_confidence_uses_current_scale(self) -> None:
        store = ResidualStore()
        for seed in range(8):
            store.add(_residual(2.0, seed=seed))
        corrector = Corrector()
        assert corrector.confidence(store) == pytest.approx(0.0, abs=1e-9)
        for residual in store.recent():
            corrector.update(residual)
        assert 0.0 < corrector.confidence(store) <= 1.0

    @pytest.mark.parametrize(
        ("kwargs", "match"), [({"rate": 0.0}, "rate"), ({"max_scale": 0.0}, "max_scale")]
    )
    def test_validation(self, kwargs: dict[str, float], match: str) -> None:
        with pytest.raises(ValueError, match=match):
            Corrector(**kwargs)

    def test_state_round_trip(self) -> None:
        corrector = Corrector()
        corrector.update(_residual(2.0))
        corrector.penalize()
        other = Corrector()
        other.load_state_dict(json.loads(json.dumps(corrector.state_dict())))
        assert other.scale == corrector.scale
        assert other.rollbacks == 1
