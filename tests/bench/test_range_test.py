"""The range test's centre: a tenth of the rate at the smoothed loss's minimum, looked for once the average
holds a few losses."""

import math

import pytest

from hf_hybrid.bench.range_test import MIN_AVERAGED, ramp, suggested_rate

# `decoder_lora`'s range test, recorded by `benchmarks/range_test_calibration.py` (seed 0, 50 steps): the
# loss barely moves until it blows up, and its second batch is one of the lowest
DECODER_LORA = [
    2.407,
    2.384,
    2.369,
    2.555,
    2.618,
    2.264,
    2.509,
    2.411,
    2.56,
    2.633,
    2.539,
    2.513,
    2.509,
    2.383,
    2.388,
    2.227,
    2.482,
    2.397,
    2.453,
    2.324,
    2.445,
    2.551,
    2.529,
    2.36,
    2.381,
    2.368,
    2.562,
    2.239,
    2.479,
    2.326,
    2.406,
    2.388,
    2.419,
    2.436,
    2.618,
    2.722,
    3.422,
    5.924,
    3.847,
    3.967,
    5.214,
    5.156,
    4.012,
    4.139,
    3.519,
    3.79,
    3.483,
    3.671,
    3.574,
    3.189,
]


def test_the_centre_is_a_tenth_of_the_rate_at_the_smoothed_minimum():
    steps = 40
    losses = [3.0 - 0.05 * i for i in range(30)] + [300.0] * 10
    assert suggested_rate(losses, steps) == pytest.approx(ramp(29, steps) / 10, rel=0.01)


def test_a_low_first_batch_is_not_the_minimum():
    """Before the average holds `MIN_AVERAGED` losses it is a batch or two: a low one there would set a
    centre at the test's lowest rates."""
    steps = 40
    losses = [2.4, 2.0] + [2.4] * 28 + [2.1] * 5 + [300.0] * 5
    assert MIN_AVERAGED > 2
    assert suggested_rate(losses, steps) == pytest.approx(ramp(34, steps) / 10, rel=0.01)


def test_a_flat_noisy_fine_tune_gets_a_centre_near_its_raced_rate():
    """The recorded `decoder_lora` test: its race chose 0.004; the second batch's loss as the minimum had
    made the centre 1.6e-8."""
    centre = suggested_rate(DECODER_LORA, len(DECODER_LORA))
    assert 0.004 / 4 <= centre <= 0.004 * 4


def test_a_loss_that_is_not_finite_ends_the_search():
    losses = [2.0 - 0.1 * i for i in range(10)] + [math.nan, 0.0]
    assert suggested_rate(losses, 12) == pytest.approx(ramp(9, 12) / 10, rel=0.01)
