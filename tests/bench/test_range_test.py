"""The range test's centre: the rate where the smoothed loss blows up (4x its minimum, the minimum looked
for once the average holds a few losses), over a divisor calibrated on the recorded tests."""

import json
import math
from pathlib import Path

import pytest

from hf_hybrid.bench.range_test import BLOW_UP_DIVISOR, MIN_AVERAGED, blow_up_step, ramp, suggested_rate

CALIBRATION = Path(__file__).resolve().parents[2] / "benchmarks/results/range_test/range_tests.json"

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


def test_the_centre_is_the_blow_up_rate_over_the_divisor():
    steps = 40
    losses = [3.0 - 0.05 * i for i in range(30)] + [300.0] * 10
    assert blow_up_step(losses) == 30
    assert suggested_rate(losses, steps) == pytest.approx(ramp(30, steps) / BLOW_UP_DIVISOR, rel=0.01)


def test_a_low_first_batch_is_not_the_minimum_the_blow_up_is_measured_from():
    """Before the average holds `MIN_AVERAGED` losses it is a batch or two: a very low first batch would
    make every later loss read as a blow-up."""
    losses = [0.01] + [2.4] * 29 + [300.0] * 5
    assert MIN_AVERAGED > 1
    assert blow_up_step(losses) == 30


def test_a_flat_noisy_fine_tune_gets_a_centre_near_its_raced_rate():
    """The recorded `decoder_lora` test: its race chose 0.004; its loss's minimum is a pick among flat
    batches (the second batch's had made the centre 1.6e-8, the minimum/10 rule 0.0012)."""
    centre = suggested_rate(DECODER_LORA, len(DECODER_LORA))
    assert 0.004 / 2 <= centre <= 0.004 * 2


def test_a_loss_that_is_not_finite_is_the_blow_up():
    losses = [2.0 - 0.1 * i for i in range(10)] + [math.nan, 0.0]
    assert blow_up_step(losses) == 10
    assert suggested_rate(losses, 12) == pytest.approx(ramp(10, 12) / BLOW_UP_DIVISOR, rel=0.01)


def test_a_loss_that_never_blows_up_reads_the_last_rate():
    losses = [2.0 - 0.01 * i for i in range(20)]
    assert blow_up_step(losses) == 19


def test_every_recorded_range_test_lands_within_a_widening_of_its_raced_rate():
    """The calibration the divisor was fitted on (in sample: this guards the rule against a change that
    breaks it, it is no out-of-sample claim): every centre within 3x of the rate its race chose, so the
    first grid (x0.5-x2) or one widening holds it."""
    rows = json.loads(CALIBRATION.read_text())
    assert len(rows) >= 7
    for row in rows:
        ratio = suggested_rate(row["losses"], row["steps"]) / row["raced_rate"]
        assert 1 / 3 <= ratio <= 3, (row["task"], ratio)
