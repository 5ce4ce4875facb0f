"""Successive halving's choices, on loss tables written by hand: which points it asks for, in which
order, where it widens, and when it calls a budget's judge untuned."""

from __future__ import annotations

from hf_hybrid.bench.sweep import successive_halving


def table(losses: dict[float, dict[float, float]]):
    """`losses[budget][multiplier]`; a point not in the table has not run yet."""

    def loss_at(multiplier: float, budget: float) -> float | None:
        return losses.get(budget, {}).get(multiplier)

    return loss_at


# a rate's eval loss at each budget: x2 is best at the full budget, x4 at the shorter ones
BOWL = {
    0.25: {0.5: 3.0, 1.0: 2.8, 2.0: 2.6, 4.0: 2.5, 8.0: 2.7},
    0.5: {1.0: 2.5, 2.0: 2.3, 4.0: 2.25},
    0.75: {1.0: 2.3, 2.0: 2.1, 4.0: 2.15},
    1.0: {1.0: 2.2, 2.0: 2.0},  # x4 never runs at the full budget: it lost at 3/4
}


def test_every_first_rate_runs_to_the_first_budget_before_anything_else():
    state = successive_halving((0.5, 1, 2, 4), 3, table({}))
    assert state.wanted == [(0.5, 0.25), (1, 0.25), (2, 0.25), (4, 0.25)]
    assert not state.best


def test_a_best_rate_at_the_top_edge_widens_by_one_rate():
    state = successive_halving((0.5, 1, 2, 4), 3, table({0.25: {m: BOWL[0.25][m] for m in (0.5, 1, 2, 4)}}))
    assert state.wanted == [(8.0, 0.25)]


def test_the_best_and_the_rate_below_it_go_on_and_the_best_shifts_down_with_the_budget():
    known = {0.25: BOWL[0.25], 0.5: {2.0: 2.3, 4.0: 2.25}}
    state = successive_halving((0.5, 1, 2, 4), 3, table(known))
    assert state.best[0.25] == 4.0 and state.best[0.5] == 4.0
    assert state.wanted == [(2.0, 0.75), (4.0, 0.75)]  # only x4 and x2 go on from 1/2
    # at 3/4 x2 wins: the rate below it (x1) must run there to show it interior
    known[0.75] = {2.0: 2.1, 4.0: 2.15}
    state = successive_halving((0.5, 1, 2, 4), 3, table(known))
    assert state.wanted == [(1.0, 0.75)]
    state = successive_halving((0.5, 1, 2, 4), 3, table(BOWL))
    assert state.complete
    assert state.best == {0.25: 4.0, 0.5: 4.0, 0.75: 2.0, 1.0: 2.0}
    assert state.untuned == {}
    assert state.active[1.0] == [1.0, 2.0]  # x4 above lost at 3/4: not carried to the full budget


def test_a_rate_above_the_best_that_lost_at_a_shorter_budget_counts_as_worse():
    # at 1/2 x4 is best of {x2, x4}; x8 never ran at 1/2 but lost to x4 at 1/4: x4 is interior
    state = successive_halving((0.5, 1, 2, 4), 3, table(BOWL))
    assert 8.0 not in state.active[0.5]


def test_a_best_rate_still_at_the_edge_after_the_widenings_leaves_the_judge_untuned():
    falling = {b: {m: 5.0 - m * 0.1 for m in (0.5, 1, 2, 4, 8)} for b in (0.25, 0.5, 0.75, 1.0)}
    state = successive_halving((0.5, 1, 2, 4), 1, table(falling))
    assert state.complete
    assert state.best[0.25] == 8.0
    assert "x8 is the highest tried after widening 1 time(s)" in state.untuned[0.25]


def test_the_same_points_give_the_same_decisions():
    a = successive_halving((0.5, 1, 2, 4), 3, table(BOWL)).to_dict()
    b = successive_halving((0.5, 1, 2, 4), 3, table(dict(reversed(list(BOWL.items()))))).to_dict()
    assert a == b
