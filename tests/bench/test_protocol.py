"""Each rule of the protocol (`hf_hybrid/bench/protocol.py`), tested from its statement on numbers worked
out by hand: the race, the band and the resolution, the verdict words, the early stop, the other seeds,
same-trajectory methods, and the rules' table that the docs print."""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from hf_hybrid.bench import protocol as rules
from hf_hybrid.bench.protocol import Band

DOCS = Path(__file__).resolve().parents[2] / "docs" / "bench.md"


def table(losses: dict[float, dict[float, float]]):
    """`losses[budget][rate]`; a point not in the table has not run yet."""
    return lambda rate, budget: losses.get(budget, {}).get(rate)


# x2 is best at both rungs
BOWL = {0.25: {1.0: 2.8, 2.0: 2.6, 4.0: 2.7}, 0.5: {1.0: 2.4, 2.0: 2.3}}


# ---- the race ------------------------------------------------------------------------------------------


def test_every_first_rate_runs_to_the_first_rung_before_anything_else():
    state = rules.race([1.0, 2.0, 4.0], table({}))
    assert state.wanted == [(1.0, 0.25), (2.0, 0.25), (4.0, 0.25)]
    assert not state.decided


def test_from_one_rung_to_the_next_go_the_best_and_the_rate_below_it():
    state = rules.race([1.0, 2.0, 4.0], table({0.25: BOWL[0.25]}))
    assert state.best[0.25] == 2.0
    assert state.wanted == [(1.0, 0.5), (2.0, 0.5)]  # x4, above the best, is not carried


def test_after_the_last_rung_the_winner_alone_goes_on_to_the_full_budget():
    state = rules.race([1.0, 2.0, 4.0], table(BOWL))
    assert state.decided and state.wanted == []
    assert state.best == {0.25: 2.0, 0.5: 2.0, 0.75: 2.0, 1.0: 2.0}
    assert state.rate == 2.0


def test_a_best_rate_at_the_bottom_edge_widens_down_at_every_rung():
    rising = {0.25: {1.0: 2.6, 2.0: 2.7, 4.0: 2.8}}
    assert rules.race([1.0, 2.0, 4.0], table(rising)).wanted == [(0.5, 0.25)]


def test_a_best_rate_at_the_top_edge_of_a_shorter_rung_is_carried_without_widening():
    # a shorter budget favours a larger rate: x4 at the top of 1/4 says little about the full budget
    falling = {0.25: {1.0: 2.8, 2.0: 2.7, 4.0: 2.6}}
    state = rules.race([1.0, 2.0, 4.0], table(falling))
    assert state.wanted == [(2.0, 0.5), (4.0, 0.5)] and state.untuned == {}


def test_at_the_last_rung_the_rate_above_runs_first_at_the_first_rung():
    falling = {0.25: {1.0: 2.8, 2.0: 2.7, 4.0: 2.6}, 0.5: {2.0: 2.5, 4.0: 2.4}}
    state = rules.race([1.0, 2.0, 4.0], table(falling))
    assert state.wanted == [(8.0, 0.25)] and state.rungs[0.25] == [1.0, 2.0, 4.0, 8.0]


def test_the_rate_above_worse_at_the_first_rung_closes_the_side_there():
    known = {0.25: {1.0: 2.8, 2.0: 2.7, 4.0: 2.6, 8.0: 2.65}, 0.5: {2.0: 2.5, 4.0: 2.4}}
    state = rules.race([1.0, 2.0, 4.0], table(known))
    assert state.decided and state.rate == 4.0 and state.rungs[0.5] == [2.0, 4.0]


def test_the_rate_above_better_at_the_first_rung_runs_at_the_last_rung_too():
    known = {0.25: {1.0: 2.8, 2.0: 2.7, 4.0: 2.6, 8.0: 2.55}, 0.5: {2.0: 2.5, 4.0: 2.4}}
    state = rules.race([1.0, 2.0, 4.0], table(known))
    assert state.wanted == [(8.0, 0.5)]
    known[0.5][8.0] = 2.45
    state = rules.race([1.0, 2.0, 4.0], table(known))
    assert state.decided and state.rate == 4.0
    assert state.best[0.25] == 8.0  # the frontier's 1/4 point: the best the race ran there


def test_the_rate_above_better_at_the_first_rung_only_within_the_noise_closes_the_side():
    # x8 beats x4 at 1/4 by 0.05: two paired standard errors of 0.03 (0.06) hold that tie, so a larger
    # rate that only ties on a short budget is not run at the longer one; at 0.02 the win is real
    known = {0.25: {1.0: 2.8, 2.0: 2.7, 4.0: 2.6, 8.0: 2.55}, 0.5: {2.0: 2.5, 4.0: 2.4}}
    noisy = rules.race([1.0, 2.0, 4.0], table(known), paired_se=lambda a, b, budget: 0.03)
    assert noisy.decided and noisy.rate == 4.0 and noisy.rungs[0.5] == [2.0, 4.0]
    quiet = rules.race([1.0, 2.0, 4.0], table(known), paired_se=lambda a, b, budget: 0.02)
    assert quiet.wanted == [(8.0, 0.5)]


def test_at_the_rung_itself_only_an_exact_tie_closes_the_side():
    # x4 ran at 1/2 and is 0.01 better than x2 there: the noise is no tie at the rung that decides
    known = {0.25: {1.0: 2.8, 2.0: 2.7, 4.0: 2.75}, 0.5: {1.0: 2.5, 2.0: 2.4}}
    state = rules.race([1.0, 2.0, 4.0], table(known), paired_se=lambda a, b, budget: 1.0)
    assert state.decided and state.rate == 2.0  # x4 closed at 1/4 (worse there), not by the noise
    assert rules.open_side(2.0, 0.5, table({0.5: {1.0: 2.5, 2.0: 2.4, 4.0: 2.39}}), lambda a, b, c: 1.0) == (
        "above"
    )


def test_a_race_of_one_rung_widens_upwards_there(monkeypatch):
    monkeypatch.setattr(rules, "RACE_RUNGS", (0.25,))
    falling = {0.25: {1.0: 2.8, 2.0: 2.7, 4.0: 2.6}}
    assert rules.race([1.0, 2.0, 4.0], table(falling)).wanted == [(8.0, 0.25)]


def test_the_race_reads_only_the_points_it_asked_for():
    """A record of an earlier rule (x8 widened at 1/4, x16 too) is read as a fresh race: the points it
    did not ask for neither close a side nor join a rung, so the re-read costs what a fresh race does."""
    known = {0.25: {1.0: 2.8, 2.0: 2.7, 4.0: 2.6, 8.0: 2.5, 16.0: 2.9}, 0.5: {2.0: 2.5, 4.0: 2.4}}
    state = rules.race([1.0, 2.0, 4.0], table(known))
    assert state.wanted == [(8.0, 0.5)]  # x8 was asked for at 1/4 and won there: it runs at 1/2
    assert 16.0 not in state.rungs[0.25]


def test_a_rate_below_the_best_that_was_not_run_at_this_rung_is_run_there():
    # at 1/2 the lower of the two carried rates wins: the one below it must run at 1/2 to show it interior
    known = {0.25: BOWL[0.25], 0.5: {1.0: 2.2, 2.0: 2.3}}
    assert rules.race([1.0, 2.0, 4.0], table(known)).wanted == [(0.5, 0.5)]


def test_a_rate_above_the_best_that_lost_at_a_shorter_rung_counts_as_worse():
    # at 1/2 x2 wins over x1; x4 never ran at 1/2 but lost to x2 at 1/4: x2 is interior there
    state = rules.race([1.0, 2.0, 4.0], table(BOWL))
    assert state.rungs[0.5] == [1.0, 2.0] and state.untuned == {}


def test_a_best_rate_still_at_the_edge_after_the_widenings_is_untuned():
    falling = {b: {r: 5.0 - r / 100 for r in (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)} for b in (0.25, 0.5)}
    state = rules.race([1.0, 2.0, 4.0], table(falling), widen=1)
    assert state.decided
    assert state.best[0.5] == 8.0 and state.rungs[0.5] == [2.0, 4.0, 8.0]
    assert "x8 is the highest tried after 1 widening(s)" in state.untuned[0.5]


def test_a_tie_goes_to_the_smaller_rate():
    flat = {0.25: {0.5: 2.3, 1.0: 2.0, 2.0: 2.0, 4.0: 2.1}}
    state = rules.race([1.0, 2.0, 4.0], table(flat))
    assert state.best[0.25] == 1.0


def test_a_tie_with_the_rate_above_closes_that_side_and_the_race_ends():
    """The smaller of two equal rates wins: the equal one above it shows the side closed (it once
    widened to a rate it already had, for ever)."""
    flat = {b: {0.5: 2.45, 1.0: 2.05, 2.0: 2.05} for b in (0.25, 0.5)}
    state = rules.race([0.5, 1.0, 2.0], table(flat))
    assert state.decided and state.best[0.25] == 1.0 and not state.wanted


def test_the_first_grid_is_the_first_rates_times_the_centre():
    assert rules.first_grid(10.0) == [10.0 * r for r in rules.FIRST_RATES]
    assert rules.first_grid(1.0, (1.0, 2.0)) == [1.0, 2.0]


# ---- noise ---------------------------------------------------------------------------------------------


def test_the_bootstrap_of_independent_examples_is_the_standard_error_of_the_mean():
    draw = random.Random(0)
    diffs = [draw.gauss(0.0, 1.0) for _ in range(400)]
    analytic = statistics.stdev(diffs) / math.sqrt(len(diffs))
    assert rules.cluster_bootstrap_se(diffs) == pytest.approx(analytic, rel=0.1)


def test_examples_that_move_together_in_a_document_give_a_larger_error():
    draw = random.Random(1)
    documents = [draw.gauss(0.0, 1.0) for _ in range(40)]
    diffs = [documents[i // 10] + draw.gauss(0.0, 0.1) for i in range(400)]
    clusters = [i // 10 for i in range(400)]
    by_document = rules.cluster_bootstrap_se(diffs, clusters)
    by_example = rules.cluster_bootstrap_se(diffs)
    assert by_document > 2.5 * by_example  # ~sqrt(10): ten examples carry one document's information
    assert by_document == pytest.approx(statistics.stdev(documents) / math.sqrt(40), rel=0.15)


def test_the_bootstrap_weights_examples_by_their_tokens():
    # one heavy example carries the mean: its cluster's resampling is most of the error
    light = rules.cluster_bootstrap_se([0.0, 1.0, 0.0, 1.0], weights=[1, 1, 1, 1])
    heavy = rules.cluster_bootstrap_se([0.0, 1.0, 0.0, 1.0], weights=[1, 100, 1, 1])
    assert heavy != pytest.approx(light)


def test_the_seed_part_joins_two_runs_each_with_plain_s_variance():
    assert rules.seed_se(0.0004, 1) == pytest.approx(math.sqrt(2 * 0.0004))
    assert rules.seed_se(0.0004, 4) == pytest.approx(math.sqrt(2 * 0.0004 / 4))
    assert rules.seed_se(None, 3) is None


def test_the_slope_is_the_loss_fallen_per_e_fold_of_cost_between_the_last_two_points():
    frontier = [(10.0, 3.0), (20.0, 2.5), (30.0, 2.2), (40.0, 2.0)]
    assert rules.log_slope(frontier) == pytest.approx(0.2 / math.log(40 / 30))
    assert rules.log_slope([(30.0, 2.0), (40.0, 2.1)]) < 0  # overfits: no exchange rate


def test_the_grid_error_is_a_quarter_of_the_chord_s_miss_at_three_quarters():
    frontier = [(10.0, 3.0), (20.0, 2.5), (30.0, 2.2), (40.0, 2.0)]
    chord = 20 + 20 * (2.5 - 2.2) / (2.5 - 2.0)  # cost at which the 1/2-1 chord reaches 2.2
    assert rules.grid_error(frontier) == pytest.approx(abs(math.log(chord / 30)) / 4)
    assert rules.grid_error([(10.0, 3.0), (20.0, 2.0), (30.0, 1.0), (40.0, 0.0)]) == pytest.approx(0.0)


def test_the_band_is_a_t_interval_of_the_log_speed_up_at_its_parts_degrees_of_freedom():
    band = Band(slope=0.5, seed_se=0.03, eval_se=0.04, grid=0.01, price=0.02)
    variance = (0.03 / 0.5) ** 2 + (0.04 / 0.5) ** 2 + 0.01**2 + 0.02**2
    assert band.half_width() == pytest.approx(
        1.95996 * math.sqrt(variance), rel=1e-4
    )  # every part well known
    assert band.resolution == pytest.approx(math.exp(band.half_width()))
    three_seeds = Band(slope=0.5, seed_se=0.03, eval_se=0.0, grid=0.0, seed_df=2)  # the seeds alone: t(2)
    assert three_seeds.half_width() == pytest.approx(4.30265 * 0.03 / 0.5, rel=1e-4)
    mixed = replace(three_seeds, eval_se=0.03)  # half the variance with 2 df, half with infinitely many
    assert mixed.df() == pytest.approx(8.0)  # Welch-Satterthwaite: (2v)^2 / (v^2 / 2)
    assert mixed.half_width() == pytest.approx(rules.t_quantile(0.975, 8.0) * math.hypot(0.06, 0.06))


def test_the_slope_s_own_error_widens_a_reading_by_the_loss_it_reads():
    flat = Band(slope=0.5, seed_se=0.0, eval_se=0.01, grid=0.0, slope_se=0.05)
    assert flat.half_width() == pytest.approx(
        replace(flat, slope_se=0.0).half_width()
    )  # an identity: no shift
    shifted = replace(flat, shift=0.2)  # read 0.2 of loss away: the slope's error moves it by 0.2/slope
    assert shifted.half_width() > flat.half_width()
    expected = 1.95996 * math.hypot(0.01 / 0.5, 0.2 * 0.05 / 0.5**2)
    assert shifted.half_width() == pytest.approx(expected, rel=1e-4)


def test_t_quantiles_match_the_tables():
    for df, value in [(1, 12.7062), (2, 4.3027), (4, 2.7764), (10, 2.2281), (math.inf, 1.95996)]:
        assert rules.t_quantile(0.975, df) == pytest.approx(value, rel=1e-4)


def test_with_one_seed_the_band_knows_only_its_eval_grid_and_price_parts():
    band = Band(slope=0.5, seed_se=None, eval_se=0.04, grid=0.0)
    assert not band.known
    assert band.resolution == pytest.approx(math.exp(1.95996 * 0.04 / 0.5), rel=1e-4)


def test_a_task_whose_loss_no_longer_falls_has_no_resolution():
    band = Band(slope=-0.1, seed_se=0.01, eval_se=0.01, grid=0.0)
    assert band.half_width() == math.inf and not band.known


def _seeded(seeds: int, variance: float = 0.001, eval_se: float = 0.02, slope: float = 0.5) -> Band:
    """A band read over `seeds` seeds, its variance known from that many plain seeds."""
    return Band(slope, rules.seed_se(variance, seeds), eval_se, 0.0, seed_df=seeds - 1)


def test_seeds_and_eval_clusters_needed_for_the_target_resolution():
    seeds = rules.seeds_for(_seeded(3), 0.001)
    assert _seeded(seeds).resolution <= rules.TARGET_RESOLUTION < _seeded(seeds - 1).resolution
    noisy = _seeded(3, 0.0001, eval_se=0.04)  # the eval part alone is over the target
    factor = rules.eval_factor_for(noisy)
    assert factor > 1 and rules.seeds_for(noisy, 0.0001) is None  # seeds alone cannot get there
    more = replace(noisy, eval_se=0.04 / math.sqrt(factor))
    assert more.resolution == pytest.approx(rules.TARGET_RESOLUTION)
    stuck = Band(slope=0.5, seed_se=0.001, eval_se=0.2, grid=0.0)
    assert rules.seeds_for(stuck, 0.001) is None


def test_the_price_error_joins_a_method_s_own_kinds_with_plain_s():
    errors = {"step": 0.03, "freeze:2:step": 0.04, "forward": 0.05, "token": 0.02}
    assert rules.price_error(errors, ["step"], ["step"]) == 0.0  # plain's own steps: the price cancels
    assert rules.price_error(errors, ["token"], ["token"]) == 0.0
    assert rules.price_error(errors, ["freeze:2:step"], ["step"]) == pytest.approx(0.05)
    assert rules.price_error(errors, ["step", "forward"], ["step"]) == pytest.approx(math.hypot(0.05, 0.03))


# ---- verdicts ------------------------------------------------------------------------------------------

BAND = Band(slope=0.5, seed_se=0.02, eval_se=0.0, grid=0.0)  # half width 0.08 in log: 0.92x-1.08x


@pytest.mark.parametrize(
    ("speedup", "word"),
    [(1.2, rules.WINS), (1.05, rules.TIES), (0.95, rules.TIES), (0.8, rules.LOSES), (0.0, rules.LOSES)],
)
def test_a_verdict_wins_or_loses_only_outside_its_band(speedup, word):
    assert rules.verdict(speedup, BAND)[0] == word


def test_the_band_decides_not_the_reading_alone():
    wide = Band(slope=0.5, seed_se=0.06, eval_se=0.0, grid=0.0)  # half width 0.24: 0.79x-1.27x
    assert rules.verdict(1.2, BAND)[0] == rules.WINS
    assert rules.verdict(1.2, wide)[0] == rules.TIES


def test_one_seed_outside_the_known_part_of_the_band_is_unresolved_not_a_tie():
    one = Band(slope=0.5, seed_se=None, eval_se=0.01, grid=0.0)  # known part: 0.96x-1.04x
    assert rules.verdict(0.91, one)[0] == rules.UNRESOLVED
    assert rules.verdict(1.3, one)[0] == rules.UNRESOLVED
    assert rules.verdict(1.01, one)[0] == rules.TIES


def test_an_untuned_race_is_never_a_win_or_a_loss():
    assert rules.verdict(3.0, BAND, untuned="its race is untuned")[0] == rules.UNTUNED
    assert rules.verdict(0.2, BAND, untuned="plain is untuned")[0] == rules.UNTUNED
    stopped = rules.verdict(0.2, BAND, untuned="its race is untuned", stopped_at=0.5)
    assert stopped[0] == rules.UNTUNED and stopped[1].startswith("stopped at 0.5")


def test_a_tuned_method_stopped_early_loses():
    word, reason = rules.verdict(0.2, BAND, stopped_at=0.5)
    assert word == rules.LOSES and reason.startswith("stopped at 0.5: below twice the band (below the band")


def test_the_early_stop_needs_twice_the_band_not_one():
    width = BAND.half_width()
    assert not rules.stops_early(math.exp(-1.5 * width), BAND)  # below one band, above two
    assert rules.stops_early(math.exp(-2.5 * width), BAND)
    unknown = Band(slope=0.5, seed_se=None, eval_se=0.01, grid=0.0)
    assert not rules.stops_early(0.1, unknown)  # without the seeds' part nothing stops early


def test_other_seeds_run_where_they_can_change_the_verdict():
    one = Band(slope=0.5, seed_se=0.04, eval_se=0.0, grid=0.0)  # one seed: half width 0.16
    every = Band(slope=0.5, seed_se=0.02, eval_se=0.0, grid=0.0)  # three seeds: half width 0.08
    assert rules.more_seeds_can_change(math.exp(0.1), one, every)  # may win
    assert rules.more_seeds_can_change(math.exp(-0.2), one, every)  # may lose
    assert not rules.more_seeds_can_change(math.exp(0.05), one, every)  # a tie either way
    assert not rules.more_seeds_can_change(math.exp(-0.4), one, every)  # one seed already loses


def test_a_same_trajectory_method_must_stay_within_the_resolution():
    assert rules.same_trajectory(1.05, 1.1) and rules.same_trajectory(1 / 1.05, 1.1)
    assert not rules.same_trajectory(1.2, 1.1)


def test_a_time_verdict_reads_the_mean_log_ratio_of_its_pairs_with_a_t_interval():
    pairs = [(10.0, 8.0), (11.0, 9.0), (10.5, 8.4), (9.8, 8.1), (10.2, 8.3)]  # plain, method
    timed = rules.timing(pairs)
    logs = [math.log(p / m) for p, m in pairs]
    half = 2.7764 * statistics.stdev(logs) / math.sqrt(5)
    assert timed.ratio == pytest.approx(math.exp(statistics.fmean(logs)))
    assert timed.low == pytest.approx(math.exp(statistics.fmean(logs) - half), rel=1e-4)
    assert timed.df == 4 and rules.time_verdict(timed)[0] == rules.WINS
    slower = rules.timing([(m, p) for p, m in pairs])
    assert rules.time_verdict(slower)[0] == rules.LOSES
    noisy = rules.timing([(10.0, 8.0), (10.0, 12.5), (10.0, 9.0), (10.0, 11.0), (10.0, 9.5)])
    assert rules.time_verdict(noisy)[0] == rules.TIES
    assert rules.timing([(10.0, 8.0)]) is None and rules.time_verdict(None)[0] == rules.UNRESOLVED


def test_the_reading_budget_is_the_full_one_unless_plain_s_own_curve_turns_up():
    assert rules.reading_budget([(0.25, 3.0), (0.5, 2.5), (0.75, 2.2), (1.0, 2.0)]) == 1.0
    assert rules.reading_budget([(0.25, 3.0), (0.5, 2.5), (0.75, 2.2), (1.0, 2.3)]) == 0.75
    assert rules.reading_budget([(0.25, 3.0), (0.5, 2.2), (0.75, 2.2), (1.0, 2.3)]) == 0.75  # the larger
    assert rules.reading_budget([(0.25, math.inf), (1.0, math.inf)]) == rules.READ_AT


# ---- the rules the docs print --------------------------------------------------------------------------


def test_the_docs_print_the_rules_of_the_code():
    text = DOCS.read_text()
    assert rules.rules_markdown() in text, (
        "docs/bench.md's table of rules: run `python -m hf_hybrid.bench.protocol`"
    )


def test_a_changed_constant_changes_the_rules_the_docs_and_the_race(monkeypatch):
    monkeypatch.setattr(rules, "SPACING", 3.0)
    assert "x3 a step" in rules.rules_markdown() and rules.rules_markdown() not in DOCS.read_text()
    rising = {0.25: {1.0: 2.6, 3.0: 2.7, 9.0: 2.8}}
    assert rules.race([1.0, 3.0, 9.0], table(rising)).wanted == [(1 / 3, 0.25)]
    monkeypatch.setattr(rules, "FIRST_RATES", (0.25, 1.0, 4.0))
    assert rules.Protocol().lr_multipliers == (0.25, 1.0, 4.0)
    assert rules.first_grid(1.0) == [0.25, 1.0, 4.0]


def test_where_neither_alone_reaches_the_target_seeds_and_eval_together_are_named():
    variance = 0.02**2 * 3 / 2  # three seeds
    band = _seeded(3, variance, eval_se=0.02, slope=0.2)  # each part alone exceeds the target's room
    assert rules.seeds_for(band, variance) is None and rules.eval_factor_for(band) is None
    pairs = rules.seeds_and_eval_for(band, variance)
    assert pairs and pairs[0][1] == min(f for _, f in pairs)
    for seeds, factor in pairs:
        together = _seeded(seeds, variance, 0.02 / math.sqrt(factor), 0.2)
        fewer = _seeded(seeds - 1, variance, 0.02 / math.sqrt(factor), 0.2)
        assert together.resolution <= rules.TARGET_RESOLUTION < fewer.resolution
