"""The arena's time left (`eta.py`): the usual cost until the plan is known, then the runs planned, on a
start-up and a per-step time fitted to the runs finished."""

from __future__ import annotations

import pytest

from hf_hybrid.bench.eta import FIRST_START_UP, USUAL, Eta, usual_cost


def test_the_usual_cost_counts_plain_s_part_and_each_method_s_with_their_seeds():
    runs, budgets = usual_cost(seeds=3, methods=4)
    plain = USUAL["plain"][0] + 2 * USUAL["plain_seed"][0]
    methods = 4 * (USUAL["method"][0] + 2 * USUAL["method_seed"][0])
    assert runs == pytest.approx(plain + methods)
    assert budgets == pytest.approx(USUAL["plain"][1] + 2 * 1.0 + 4 * (1.5 + 2 * 0.25))


def test_before_any_run_the_estimate_is_a_guess_from_the_calibrated_step():
    eta = Eta(workers=2, max_steps=60, usual_runs=20, usual_steps=600, step_seconds=0.5)
    seconds, guess = eta.left(planned_runs=3, planned_steps=45)
    assert guess and seconds == pytest.approx((20 * FIRST_START_UP + 600 * 0.5) / 2)


def test_finished_runs_fit_a_start_up_and_a_step_time_and_the_plan_takes_over_once_larger():
    eta = Eta(workers=1, max_steps=100, usual_runs=4, usual_steps=200, step_seconds=9.0)
    for steps in (10, 20, 40):
        eta.add(steps, 30.0 + 2.0 * steps)  # a 30 s start-up and 2 s a step
    start_up, per_step = eta.fit()
    assert (start_up, per_step) == (pytest.approx(30.0), pytest.approx(2.0))
    seconds, guess = eta.left(planned_runs=5, planned_steps=300)  # the plan now holds more than usual
    assert not guess and seconds == pytest.approx(5 * 30.0 + 300 * 2.0)
    assert "as planned" in eta.text(5, 300) and "wall clock" in eta.text(5, 300)
