"""The arena's arithmetic against numbers worked out by hand, never against the library itself.

The frontier below is four plain runs (cost, final eval loss), the arena's 1/4, 1/2, 3/4 and full budgets,
with uneven cost gaps so that a segment read with a neighbour's end points gives another number:

    cost   100   250   300   600
    loss   4.0   3.0   2.5   2.0

A loss L between two points (c0, l0) and (c1, l1) costs c0 + (c1 - c0) * (l0 - L) / (l0 - l1); every L
below is chosen so that the fraction, and so the expected cost, is exact in binary.
"""

from __future__ import annotations

import math

import pytest

from hf_hybrid.bench.frontier import Speedup, cost_to_reach, envelope, speedup

FRONTIER = [(100.0, 4.0), (250.0, 3.0), (300.0, 2.5), (600.0, 2.0)]
# The same frontier as a record could hold it: unsorted, a diverged run, and a point that is worse than a
# cheaper one (the envelope drops both).
RAW = [(300.0, 2.5), (600.0, 2.0), (200.0, 4.5), (100.0, 4.0), (50.0, math.nan), (250.0, 3.0), (700.0, 2.0)]


def test_the_envelope_keeps_the_points_that_improve_on_every_cheaper_one():
    # (50, nan) is not finite; (200, 4.5) is worse than (100, 4.0); (700, 2.0) does not improve on 2.0
    assert envelope(RAW) == FRONTIER
    assert envelope([(10.0, math.inf), (20.0, math.nan)]) == []


@pytest.mark.parametrize(
    ("loss", "cost"),
    [
        (3.75, 137.5),  # first segment (1/4 -> 1/2 budget): 100 + 150 * 0.25
        (3.25, 212.5),  # first segment: 100 + 150 * 0.75
        (2.75, 275.0),  # second segment (1/2 -> 3/4): 250 + 50 * 0.5
        (2.875, 262.5),  # second segment: 250 + 50 * 0.25
        (2.25, 450.0),  # third segment (3/4 -> full): 300 + 300 * 0.5
        (2.125, 525.0),  # third segment: 300 + 300 * 0.75
    ],
)
def test_a_loss_inside_a_segment_is_priced_on_that_segment(loss, cost):
    assert cost_to_reach(RAW, loss) == (cost, "interpolated")
    assert cost_to_reach(FRONTIER, loss) == (cost, "interpolated")


@pytest.mark.parametrize(("loss", "cost"), [(4.0, 100.0), (3.0, 250.0), (2.5, 300.0), (2.0, 600.0)])
def test_a_loss_on_a_frontier_point_costs_that_point(loss, cost):
    assert cost_to_reach(RAW, loss) == (cost, "interpolated")


def test_beyond_the_ends_only_a_bound_is_known():
    # better than the full budget's loss: at least the full budget's cost (a lower bound on the speed-up)
    assert cost_to_reach(RAW, 1.9) == (600.0, "lower_bound")
    assert cost_to_reach(RAW, 0.0) == (600.0, "lower_bound")
    # worse than the 1/4 budget's loss: at most the 1/4 budget's cost (an upper bound on the speed-up)
    assert cost_to_reach(RAW, 4.25) == (100.0, "upper_bound")
    assert cost_to_reach(RAW, 100.0) == (100.0, "upper_bound")


def test_an_empty_frontier_is_refused():
    with pytest.raises(ValueError, match="no finite point"):
        cost_to_reach([(100.0, math.nan)], 3.0)


@pytest.mark.parametrize(
    ("loss", "cost", "expected"),
    [
        (3.25, 85.0, Speedup(2.5, "interpolated", 212.5)),  # 212.5 / 85
        (3.75, 275.0, Speedup(0.5, "interpolated", 137.5)),  # 137.5 / 275: slower than plain
        (2.75, 110.0, Speedup(2.5, "interpolated", 275.0)),
        (2.25, 600.0, Speedup(0.75, "interpolated", 450.0)),
        (2.0, 480.0, Speedup(1.25, "interpolated", 600.0)),
        (1.5, 300.0, Speedup(2.0, "lower_bound", 600.0)),  # "> 2.0x"
        (4.5, 40.0, Speedup(2.5, "upper_bound", 100.0)),  # "< 2.5x"
    ],
)
def test_speedup_is_the_plain_cost_over_the_methods_cost(loss, cost, expected):
    assert speedup(RAW, loss, cost) == expected


def test_a_diverged_run_has_no_speedup_and_a_cost_must_be_positive():
    result = speedup(RAW, math.nan, 100.0)
    assert (result.ratio, result.kind) == (0.0, "diverged") and math.isnan(result.plain_cost)
    assert speedup(RAW, math.inf, 100.0).kind == "diverged"
    with pytest.raises(ValueError, match="`cost` must be > 0"):
        speedup(RAW, 3.0, 0.0)
