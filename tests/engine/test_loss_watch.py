"""The losses the engine has seen and the forecaster trained on them (`loss_watch.py`): none asleep, one
that has seen the recent losses once awake, and a state that continues exactly."""

from __future__ import annotations

import math

from hf_hybrid.engine.loss_watch import MEMORY, LossWatch


def _feed(watch: LossWatch, steps: range) -> None:
    for t in steps:
        watch.measure(2.0 * math.exp(-t / 50) + 0.5 + 0.01 * math.sin(t), 1e-3, 1.0, 1)


def test_asleep_it_keeps_the_recent_losses_and_forecasts_nothing() -> None:
    watch = LossWatch(seed=0, awake=False)
    _feed(watch, range(50))
    assert watch.forecaster is None and watch.tensors() == []
    assert watch.forecast() is None and watch.forecast_next() is None and not watch.trusted
    assert len(watch.recent) == MEMORY and watch.measured is not None
    assert watch.forecast_error(1.0) is None  # nothing was forecast


def test_waking_builds_a_forecaster_that_has_seen_the_recent_losses() -> None:
    asleep, awake = LossWatch(seed=0, awake=False), LossWatch(seed=0, awake=True)
    _feed(asleep, range(MEMORY))
    _feed(awake, range(MEMORY))
    asleep.set_awake(True)
    assert asleep.forecaster.num_observed == awake.forecaster.num_observed == MEMORY
    assert asleep.forecast() == awake.forecast() is not None  # the same losses, the same seed
    assert asleep.forecast_error(asleep.predicted + 0.1) > 0  # signed: actual minus forecast


def test_a_non_finite_loss_is_measured_but_never_learnt() -> None:
    watch = LossWatch(seed=0, awake=True)
    _feed(watch, range(10))
    watch.measure(math.nan, 1e-3, None, 1)
    assert math.isnan(watch.measured) and len(watch.recent) == 10
    assert watch.forecaster.num_observed == 10


def test_state_round_trip_continues_exactly() -> None:
    a = LossWatch(seed=3, awake=True)
    _feed(a, range(40))
    a.forecast()
    b = LossWatch(seed=3, awake=False)
    b.load_state_dict(a.state_dict())
    b.restore_last(a.predicted, a.measured)
    assert b.forecaster is not None and (b.predicted, b.measured) == (a.predicted, a.measured)
    _feed(a, range(40, 60))
    _feed(b, range(40, 60))
    assert a.forecast() == b.forecast() and a.metrics() == b.metrics()
