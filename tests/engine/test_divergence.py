"""Tests for the divergence monitor."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import pytest
import torch

from hf_hybrid.engine.alarm import worst_level
from hf_hybrid.engine.divergence import DivergenceLevel, DivergenceMonitor


@dataclass
class Verdict:
    """One check's alarms, as the tests read them: the worst level, the reasons, the scored signals."""

    level: DivergenceLevel
    reasons: list[str]
    signals: dict[str, float]


def _check(monitor: DivergenceMonitor, *args: object, **kwargs: object) -> Verdict:
    alarms = monitor.check(*args, **kwargs)  # type: ignore[arg-type]
    return Verdict(worst_level(alarms), [a.reason for a in alarms], dict(monitor.signals))


def _smooth_loss(steps: int, seed: int, noise: float = 0.05) -> list[float]:
    """Exponentially decaying loss with Gaussian noise, from its own seeded generator."""
    gen = torch.Generator().manual_seed(seed)
    eps = torch.randn(steps, generator=gen, dtype=torch.float64).tolist()
    return [2.0 * math.exp(-t / 150) + 0.5 + noise * eps[t] for t in range(steps)]


def _warm(monitor: DivergenceMonitor, steps: int = 100, seed: int = 0) -> DivergenceMonitor:
    """Stationary noisy loss, grad norm and prediction error, all NORMAL."""
    gen = torch.Generator().manual_seed(seed)
    eps = torch.randn(steps, 3, generator=gen, dtype=torch.float64).tolist()
    for e_loss, e_grad, e_pred in eps:
        monitor.check(
            1.0 + 0.05 * e_loss, grad_norm=2.0 + 0.2 * e_grad, prediction_error=0.05 + 0.01 * abs(e_pred)
        )
    return monitor


def _copy(monitor: DivergenceMonitor) -> DivergenceMonitor:
    clone = DivergenceMonitor(monitor.sigma, monitor.history, monitor.min_history, monitor.grad_spike_ratio)
    clone.load_state_dict(monitor.state_dict())
    return clone


def test_levels_are_ordered() -> None:
    assert [int(level) for level in DivergenceLevel] == [0, 1, 2, 3]
    assert (
        DivergenceLevel.CRITICAL > DivergenceLevel.WARNING > DivergenceLevel.CAUTION > DivergenceLevel.NORMAL
    )


def test_smooth_decreasing_noisy_loss_stays_normal() -> None:
    monitor = DivergenceMonitor()
    losses = _smooth_loss(500, seed=0)
    assert len(losses) == 500
    for loss in losses:
        report = _check(monitor, loss, grad_norm=1.0)
        assert report.level == DivergenceLevel.NORMAL, report
        assert report.reasons == []


def test_smooth_loss_never_warns_across_seeds() -> None:
    # Gaussian noise may cross 3 sigma now and then (CAUTION is meant for that), never 4.5 sigma.
    cautions = 0
    for seed in range(20):
        monitor = DivergenceMonitor()
        for loss in _smooth_loss(500, seed=seed):
            level = _check(monitor, loss).level
            assert level <= DivergenceLevel.CAUTION
            cautions += level == DivergenceLevel.CAUTION
    assert cautions < 0.005 * 20 * 500


@pytest.mark.parametrize(
    ("k", "level"),
    [
        (10.0, DivergenceLevel.CRITICAL),
        (6.5, DivergenceLevel.CRITICAL),
        (5.0, DivergenceLevel.WARNING),
        (4.0, DivergenceLevel.CAUTION),
        (2.0, DivergenceLevel.NORMAL),
        (-10.0, DivergenceLevel.NORMAL),  # a drop is fine
    ],
)
def test_loss_spike_levels(k: float, level: DivergenceLevel) -> None:
    monitor = _warm(DivergenceMonitor(sigma=3.0))
    mean, std = monitor.loss_stats()
    report = _check(monitor, mean + k * std)
    assert report.level == level
    assert report.signals["loss_z"] == pytest.approx(k)
    if level > DivergenceLevel.NORMAL:
        assert any(r.startswith(f"loss z-score {k:.1f} >") for r in report.reasons), report.reasons


def test_sigma_scales_thresholds() -> None:
    monitor = _warm(DivergenceMonitor(sigma=2.0))
    mean, std = monitor.loss_stats()
    assert _check(_copy(monitor), mean + 2.5 * std).level == DivergenceLevel.CAUTION
    assert _check(_copy(monitor), mean + 3.5 * std).level == DivergenceLevel.WARNING
    assert _check(_copy(monitor), mean + 4.5 * std).level == DivergenceLevel.CRITICAL


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_loss_is_critical_at_step_zero(bad: float) -> None:
    monitor = DivergenceMonitor()
    report = _check(monitor, bad)
    assert report.level == DivergenceLevel.CRITICAL
    assert "non-finite" in report.reasons[0]
    assert math.isnan(monitor.loss_stats()[0])  # not folded into the statistics


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_grad_is_critical_at_step_zero(bad: float) -> None:
    report = _check(DivergenceMonitor(), 1.0, grad_norm=bad)
    assert report.level == DivergenceLevel.CRITICAL
    assert report.signals["grad_ratio"] == math.inf


def test_non_finite_prediction_error_is_a_warning() -> None:
    report = _check(DivergenceMonitor(), 1.0, prediction_error=math.nan)
    assert report.level == DivergenceLevel.WARNING


def test_only_non_finite_check_before_min_history() -> None:
    monitor = DivergenceMonitor(min_history=10)
    for _ in range(9):
        _check(monitor, 1.0, grad_norm=1.0, prediction_error=0.01)
    report = _check(monitor, 1000.0, grad_norm=1e6, prediction_error=50.0)
    assert report.level == DivergenceLevel.NORMAL
    assert report.signals == {}
    # That step was folded in (it was below WARNING), so this is the 11th observation and gets scored.
    assert "loss_z" in _check(monitor, 1.0).signals


@pytest.mark.parametrize(
    ("grad", "level"),
    [
        (2.0 * 5, DivergenceLevel.NORMAL),
        (2.0 * 15, DivergenceLevel.WARNING),
        (2.0 * 150, DivergenceLevel.CRITICAL),
    ],
)
def test_grad_spike(grad: float, level: DivergenceLevel) -> None:
    monitor = _warm(DivergenceMonitor(grad_spike_ratio=10.0))
    report = _check(monitor, None, grad_norm=grad)
    assert report.level == level
    assert report.signals["grad_ratio"] == pytest.approx(grad / 2.0, rel=0.05)
    if level > DivergenceLevel.NORMAL:
        assert report.reasons[0].startswith("grad norm ratio")


def test_prediction_error_spike() -> None:
    monitor = _warm(DivergenceMonitor())
    report = _check(monitor, 1.0, prediction_error=1.0)
    assert report.level == DivergenceLevel.CRITICAL
    assert report.signals["prediction_error_z"] > 6.0
    assert report.reasons[0].startswith("prediction error z-score")
    assert "loss_z" in report.signals and "grad_ratio" not in report.signals


def test_worst_signal_decides_and_all_reasons_listed() -> None:
    monitor = _warm(DivergenceMonitor())
    mean, std = monitor.loss_stats()
    report = _check(monitor, mean + 4.0 * std, grad_norm=2.0 * 50, prediction_error=0.05)
    assert report.level == DivergenceLevel.WARNING
    assert len(report.reasons) == 2


def test_spikes_do_not_poison_statistics() -> None:
    monitor = _warm(DivergenceMonitor())
    before = monitor.state_dict()
    mean, std = monitor.loss_stats()
    assert _check(monitor, mean + 10 * std, grad_norm=2.0 * 200, prediction_error=5.0).level == (
        DivergenceLevel.CRITICAL
    )
    assert _check(monitor, mean + 5 * std).level == DivergenceLevel.WARNING
    after = monitor.state_dict()
    assert after.pop("alarm_streak") == 2
    before.pop("alarm_streak")
    assert after == before
    report = _check(monitor, mean, grad_norm=2.0, prediction_error=0.05)
    assert report.level == DivergenceLevel.NORMAL


def test_caution_steps_still_update_statistics() -> None:
    monitor = _warm(DivergenceMonitor())
    mean, std = monitor.loss_stats()
    assert _check(monitor, mean + 4 * std).level == DivergenceLevel.CAUTION
    assert monitor.loss_stats()[0] > mean


def test_loss_none_means_not_measured() -> None:
    monitor = _warm(DivergenceMonitor())
    stats = monitor.loss_stats()
    report = _check(monitor, None)
    assert report == Verdict(DivergenceLevel.NORMAL, [], {})
    report = _check(monitor, None, grad_norm=2.1)
    assert report.level == DivergenceLevel.NORMAL
    assert set(report.signals) == {"grad_ratio"}
    assert monitor.loss_stats() == stats


def test_flat_loss_has_finite_z_scores() -> None:
    monitor = DivergenceMonitor()
    for _ in range(50):
        assert _check(monitor, 2.0, grad_norm=1.0, prediction_error=0.0).level == DivergenceLevel.NORMAL
    mean, std = monitor.loss_stats()
    assert mean == pytest.approx(2.0)
    assert 0.0 < std < 0.1
    report = _check(_copy(monitor), 2.001, grad_norm=1.0, prediction_error=0.0)
    assert report.level == DivergenceLevel.NORMAL
    assert all(math.isfinite(v) for v in report.signals.values())
    assert _check(_copy(monitor), 2.5).level == DivergenceLevel.CRITICAL


def test_loss_stats_nan_before_observations() -> None:
    mean, std = DivergenceMonitor().loss_stats()
    assert math.isnan(mean) and math.isnan(std)


def test_accepts_tensor_scalars() -> None:
    monitor = DivergenceMonitor()
    report = _check(monitor, torch.tensor(1.5), grad_norm=torch.tensor(0.3))  # type: ignore[arg-type]
    assert report.level == DivergenceLevel.NORMAL
    assert monitor.loss_stats()[0] == pytest.approx(1.5)


def test_state_dict_round_trip() -> None:
    original = _warm(DivergenceMonitor(), steps=40)
    state = json.loads(json.dumps(original.state_dict()))  # must be plain JSON
    restored = DivergenceMonitor()
    restored.load_state_dict(state)
    assert restored.loss_stats() == original.loss_stats()
    losses = _smooth_loss(100, seed=3) + [50.0, math.nan, 1.0]
    for t, loss in enumerate(losses):
        args = (loss, 1.0 + 0.01 * t, 0.05)
        assert _check(restored, *args) == _check(original, *args)
    assert restored.state_dict() == original.state_dict()


def test_load_state_dict_validation() -> None:
    with pytest.raises(ValueError, match="lacks .*'steps'"):
        DivergenceMonitor().load_state_dict({"loss": {"mean": 0.0, "var": 0.0, "count": 0}})


def test_global_rng_untouched() -> None:
    torch.manual_seed(99)
    before = torch.get_rng_state().clone()
    monitor = _warm(DivergenceMonitor())
    _check(monitor, math.nan)
    monitor.load_state_dict(monitor.state_dict())
    assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"sigma": 0.0}, "sigma"),
        ({"sigma": math.inf}, "sigma"),
        ({"history": 1}, "history"),
        ({"history": 2.5}, "history"),
        ({"history": True}, "history"),
        ({"min_history": 0}, "min_history"),
        ({"min_history": 2.5}, "min_history"),
        ({"grad_spike_ratio": 1.0}, "grad_spike_ratio"),
        ({"grad_spike_ratio": math.nan}, "grad_spike_ratio"),
    ],
)
def test_constructor_validation(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        DivergenceMonitor(**kwargs)


def test_a_loss_better_than_forecast_never_alarms() -> None:
    monitor = DivergenceMonitor(sigma=3.0, min_history=10)
    for i in range(50):
        _check(monitor, 1.0, prediction_error=0.01 * ((i % 5) - 2))
    assert _check(_copy(monitor), 1.0, prediction_error=-5.0).level == DivergenceLevel.NORMAL
    assert _check(_copy(monitor), 1.0, prediction_error=5.0).level == DivergenceLevel.CRITICAL


def test_check_validation() -> None:
    monitor = DivergenceMonitor()
    with pytest.raises(ValueError, match="prediction_error"):
        _check(monitor, 1.0, prediction_error="x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="loss"):
        _check(monitor, "high")  # type: ignore[arg-type]


def test_a_lasting_shift_is_relearned_instead_of_alarming_for_ever() -> None:
    monitor = DivergenceMonitor(sigma=3.0, min_history=10)
    for i in range(50):
        _check(monitor, 1.0 + 0.01 * ((i % 5) - 2))
    levels = [_check(monitor, 2.0 + 0.01 * ((i % 5) - 2)).level for i in range(40)]
    assert levels[0] == DivergenceLevel.CRITICAL
    assert all(level >= DivergenceLevel.WARNING for level in levels[:10])
    assert all(level == DivergenceLevel.NORMAL for level in levels[25:])
    restored = DivergenceMonitor(sigma=3.0, min_history=10)
    restored.load_state_dict(monitor.state_dict())
    assert restored.state_dict() == monitor.state_dict()


def test_a_spike_during_a_steep_descent_is_seen() -> None:
    """A fine-tune's loss falls steeply at first; a spike of 15 noise units in the middle of that descent
    is a WARNING at least. The robust window's noise (step-to-step differences) hardly sees the trend;
    the running mean and variance this monitor had before lagged the descent and counted it as spread:
    they scored the same spike -0.5 (NORMAL)."""
    gen = torch.Generator().manual_seed(0)
    eps = torch.randn(80, generator=gen, dtype=torch.float64).tolist()
    losses = [1.0 + 2.0 * math.exp(-t / 20) + 0.02 * eps[t] for t in range(80)]
    monitor = DivergenceMonitor()
    for loss in losses[:40]:
        assert _check(monitor, loss).level <= DivergenceLevel.CAUTION
    assert _check(monitor, losses[40] + 0.3).level >= DivergenceLevel.WARNING
