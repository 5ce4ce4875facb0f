"""A method's reading on a per-budget plain frontier and its verdict, against numbers worked out by hand."""

from __future__ import annotations

import pytest

from hf_hybrid.bench.plan import paired_noise
from hf_hybrid.bench.rows import RunRow
from hf_hybrid.bench.verdicts import judge, reading


def _row(budget, units, loss, seconds=None, seed=0):
    return RunRow(
        key=f"{budget}-{units}-{loss}",
        method="m",
        seed=seed,
        lr_multiplier=1.0,
        learning_rate=1e-3,
        kind="branch",
        budget=budget,
        start=0,
        stop=0,
        steps=0,
        point=True,
        eval_loss=loss,
        units=units,
        seconds=units / 10 if seconds is None else seconds,
        own_seconds=0.0,
        wall_seconds=0.0,
        clock="cpu_time",
    )


# plain at each budget's own best rate: (units, loss)
FRONTIER = [_row(0.25, 10, 3.0), _row(0.5, 20, 2.5), _row(0.75, 30, 2.2), _row(1.0, 40, 2.0)]


@pytest.mark.parametrize(
    ("units", "loss", "expected", "kind"),
    [
        (20, 2.2, 30 / 20, "interpolated"),  # exactly the 3/4 point
        (50, 2.35, 25 / 50, "interpolated"),  # halfway from 2.5 (20) to 2.2 (30)
        (10, 2.75, 15 / 10, "interpolated"),  # the first segment: halfway from 3.0 (10) to 2.5 (20)
        (10, 2.1, 35 / 10, "interpolated"),  # the last segment: halfway from 2.2 (30) to 2.0 (40)
        (20, 1.9, 40 / 20, "lower_bound"),  # better than the full budget: at least 2x
        (5, 3.5, 10 / 5, "upper_bound"),  # worse than the cheapest point: at most 2x
    ],
)
def test_a_reading_is_the_plain_cost_to_reach_the_loss_over_the_cost(units, loss, expected, kind):
    read = reading(FRONTIER, _row(1.0, units, loss, seconds=1.0))
    assert read["speedup_units"] == pytest.approx(expected)
    assert read["speedup_units_kind"] == kind
    assert read["loss_delta"] == pytest.approx(loss - 2.0)  # against plain at the same budget


def test_time_is_read_on_the_frontier_of_times():
    # the frontier's times are units / 10: plain needs 3 s to reach 2.2; the method spent 1 s
    assert reading(FRONTIER, _row(1.0, 20, 2.2, seconds=1.0))["speedup_time"] == pytest.approx(3.0)


def test_a_diverged_run_reads_zero():
    read = reading(FRONTIER, _row(1.0, 20, float("nan")))
    assert read["speedup_units"] == 0.0 and read["speedup_units_kind"] == "diverged"


@pytest.mark.parametrize(
    ("values", "band", "verdict"),
    [
        ([1.5, 1.3], 0.125, "wins"),
        ([1.5, 1.1], 0.125, "ties"),  # one seed inside the band
        ([0.8, 0.7], 0.125, "loses"),
        ([0.95, 0.7], 0.125, "ties"),
        ([0.7], 0.125, "loses"),  # one seed below 1 - twice the band
        ([0.8], 0.125, "ties"),  # one seed below 1 - band only: the other seeds would decide
        ([1.3], 0.125, "ties"),  # one seed cannot show a win
        ([3.0], None, "ties"),
        ([0.85], None, "loses"),
        ([0.95], None, "ties"),
    ],
)
def test_verdicts(values, band, verdict):
    assert judge([{"speedup_units": v} for v in values], band)[0] == verdict


def test_the_band_decides_not_the_median():
    # both seeds read 1.2x; a band of 0.25 leaves that a tie, a band of 0.15 makes it a win
    rows = [{"speedup_units": 1.2}, {"speedup_units": 1.2}]
    assert judge(rows, 0.25)[0] == "ties" and judge(rows, 0.15)[0] == "wins"


def test_the_paired_eval_noise_is_the_standard_error_of_the_differences():
    # differences 0.1, 0.3, 0.2, 0.2: mean 0.2, sample sd sqrt(0.02/3), over sqrt(4)
    a, b = [1.1, 1.3, 1.2, 1.2], [1.0, 1.0, 1.0, 1.0]
    assert paired_noise(a, b) == pytest.approx((0.02 / 3) ** 0.5 / 2)
