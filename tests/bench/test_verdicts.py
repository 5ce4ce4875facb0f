"""A method's reading on plain's frontier (`reading.py`), against numbers worked out by hand: the speed-up
at equal eval loss, each seed paired with plain's run of that seed, and the eval set's part of the band."""

from __future__ import annotations

import dataclasses
import math

import pytest

from hf_hybrid.bench import protocol as rules
from hf_hybrid.bench.reading import Evidence, mean_difference_se, paired_se, read
from hf_hybrid.bench.rows import RunRow
from hf_hybrid.bench.verdicts import never_engaged


def _row(budget, units, loss, seconds=None, seed=0, examples=None):
    return RunRow(
        key=f"{budget}-{units}-{loss}-{seed}",
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
        eval_example_losses=examples,
        invocation="one",
    )


# plain on the first seed at each budget's raced rate: (units, loss)
FRONTIER = [_row(0.25, 10, 3.0), _row(0.5, 20, 2.5), _row(0.75, 30, 2.2), _row(1.0, 40, 2.0)]
EVIDENCE = Evidence(FRONTIER, {0: FRONTIER[-1]})


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
    reading = read(EVIDENCE, {0: _row(1.0, units, loss, seconds=1.0)})
    assert reading.speedup == pytest.approx(expected)
    assert reading.kind == kind
    assert reading.loss_delta == pytest.approx(loss - 2.0)  # against plain's full-budget run


def test_time_is_read_on_the_frontier_of_times():
    # the frontier's times are units / 10: plain needs 3 s to reach 2.2; the method spent 1 s
    assert read(EVIDENCE, {0: _row(1.0, 20, 2.2, seconds=1.0)}).speedup_time == pytest.approx(3.0)


def test_no_time_is_read_from_runs_timed_in_another_invocation():
    """A machine's load moves between invocations (130.5 s against 35.1 s for the same quarter point):
    a raced method's seconds read on a frontier timed in another invocation give no time speed-up."""
    later = dataclasses.replace(_row(1.0, 20, 2.2, seconds=1.0), invocation="two")
    assert read(EVIDENCE, {0: later}).speedup_time is None
    mixed = dataclasses.replace(FRONTIER[2], invocation="mixed")  # a trunk resumed by another invocation
    evidence = Evidence([*FRONTIER[:2], mixed, FRONTIER[3]], {0: FRONTIER[-1]})
    assert read(evidence, {0: _row(1.0, 20, 2.2, seconds=1.0)}).speedup_time is None


def test_a_diverged_run_reads_zero():
    reading = read(EVIDENCE, {0: _row(1.0, 20, float("nan"))})
    assert reading.speedup == 0.0 and reading.kind == "diverged"


def test_each_seed_is_paired_with_plain_s_run_of_that_seed():
    """Seed 1's plain run ended 0.1 higher than seed 0's; the method beat each seed's plain by 0.05 and
    0.15: the mean difference -0.1 is added to seed 0's plain loss (2.0) and read there: 1.9, a lower
    bound. Against seed 0's plain run alone, seed 1's method would have looked 0.1 worse."""
    plain = {0: FRONTIER[-1], 1: _row(1.0, 40, 2.1, seed=1)}
    method = {0: _row(1.0, 40, 1.95), 1: _row(1.0, 40, 1.95, seed=1)}
    reading = read(Evidence(FRONTIER, plain), method)
    assert reading.loss_delta == pytest.approx(-0.1)
    assert [s["loss_delta"] for s in reading.per_seed] == pytest.approx([-0.05, -0.15])
    assert reading.kind == "lower_bound" and reading.speedup == pytest.approx(1.0)
    assert reading.band.seed_se == pytest.approx(rules.seed_se(0.1**2 / 2, 2))  # plain's two seeds


def test_a_seed_without_its_plain_run_is_not_read():
    reading = read(EVIDENCE, {0: _row(1.0, 40, 2.0), 1: _row(1.0, 40, 1.0, seed=1)})
    assert [s["seed"] for s in reading.per_seed] == [0] and reading.loss_delta == pytest.approx(0.0)
    assert read(EVIDENCE, {1: _row(1.0, 40, 1.0, seed=1)}) is None  # the first seed decides


def test_the_paired_eval_noise_is_the_bootstrap_of_the_per_example_differences():
    # differences 0.1, 0.3, 0.2, 0.2: their mean's bootstrap standard error is the plug-in one,
    # sqrt(sum of squared deviations) / n = sqrt(0.02) / 4
    a = _row(1.0, 40, 1.2, examples=[1.1, 1.3, 1.2, 1.2])
    b = _row(1.0, 40, 1.0, examples=[1.0, 1.0, 1.0, 1.0])
    assert paired_se(a, b) == pytest.approx(rules.cluster_bootstrap_se([0.1, 0.3, 0.2, 0.2]))
    assert paired_se(a, b) == pytest.approx(math.sqrt(0.02) / 4, rel=0.1)
    assert paired_se(a, _row(1.0, 40, 1.0)) == math.inf  # without per-example losses: unknown


def test_the_eval_noise_of_a_mean_over_seeds_bootstraps_the_mean_difference_per_example():
    """Two seeds whose per-example differences are opposite: their mean is the same on every example, and
    the eval set adds no noise to it (each seed's alone would)."""
    plain = [_row(1.0, 40, 1.0, examples=[1.0, 1.0, 1.0, 1.0], seed=s) for s in (0, 1)]
    method = [
        _row(1.0, 40, 1.0, examples=[1.1, 0.9, 1.2, 0.8]),
        _row(1.0, 40, 1.0, examples=[0.9, 1.1, 0.8, 1.2], seed=1),
    ]
    assert paired_se(method[0], plain[0]) > 0.03
    pairs = list(zip(method, plain, strict=True))
    assert mean_difference_se(pairs, None, None) == pytest.approx(0.0, abs=1e-12)
    assert mean_difference_se([(method[0], _row(1.0, 40, 1.0))], None, None) is None


def test_a_verdict_is_never_engaged_only_when_every_run_it_reads_says_so():
    idle = "No predict phase opened: the run ended inside the warmup"
    acted, quiet = _row(1.0, 40, 2.0), _row(1.0, 40, 2.0, seed=1)
    quiet.note = idle
    assert never_engaged([quiet]) == idle
    assert never_engaged([acted, quiet]) is None  # one seed acted
    assert never_engaged([acted]) is None  # an early segment's note is not among the rows read
