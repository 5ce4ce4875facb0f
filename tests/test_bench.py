"""The benchmark's pieces: frontier maths, replayed control phases, hybrid overrides, the GPU preset.

The arena end to end is in test_arena.py."""

from __future__ import annotations

import math

import pytest

from hf_hybrid.bench.frontier import cost_to_reach, envelope, speedup
from hf_hybrid.engine.phases import Phase, PhaseController, PhaseSchedule

FRONTIER = [(10.0, 3.0), (20.0, 2.5), (30.0, 2.2), (40.0, 2.0)]


class TestFrontier:
    def test_envelope_drops_points_that_do_not_improve(self):
        assert envelope([(20.0, 2.5), (10.0, 3.0), (30.0, 2.6), (40.0, 2.0)]) == [
            (10.0, 3.0),
            (20.0, 2.5),
            (40.0, 2.0),
        ]

    def test_interpolates_between_bracketing_budgets(self):
        cost, kind = cost_to_reach(FRONTIER, 2.35)
        assert kind == "interpolated"
        assert cost == pytest.approx(25.0)
        assert cost_to_reach(FRONTIER, 2.0) == (40.0, "interpolated")

    def test_better_than_every_point_is_a_lower_bound(self):
        result = speedup(FRONTIER, 1.9, cost=20.0)
        assert (result.ratio, result.kind) == (2.0, "lower_bound")

    def test_worse_than_the_cheapest_point_is_an_upper_bound(self):
        result = speedup(FRONTIER, 3.5, cost=40.0)
        assert (result.ratio, result.kind) == (0.25, "upper_bound")

    def test_equal_quality_at_equal_cost_is_one(self):
        assert speedup(FRONTIER, 2.2, cost=30.0).ratio == pytest.approx(1.0)

    def test_diverged_run_has_no_speedup(self):
        assert speedup(FRONTIER, math.nan, cost=10.0).kind == "diverged"


def test_a_scripted_controller_replays_the_phases_exactly():
    W, F, P, C = Phase.WARMUP, Phase.FULL, Phase.PREDICT, Phase.CORRECT
    script = (W, W, F, P, P, C, F, P, C, P, C, F)
    controller = PhaseController(PhaseSchedule(warmup_steps=2, script=script))
    decided = [controller.decide(0.0, 0, lambda cap: 99) for _ in range(len(script) + 2)]
    assert decided == [*script, F, F]


class TestHybridOverrides:
    def test_values_are_typed_by_their_fields(self):
        from hf_hybrid.bench.overrides import parse_hybrid_overrides

        got = parse_hybrid_overrides(
            ["hybrid_predictor=adam", "hybrid_warmup_steps=5", "hybrid_max_delta=0.1",
             "hybrid_rollback=false", "hybrid_seed=none"]
        )  # fmt: skip
        assert got == {"hybrid_predictor": "adam", "hybrid_warmup_steps": 5, "hybrid_max_delta": 0.1,
                       "hybrid_rollback": False, "hybrid_seed": None}  # fmt: skip
        assert type(got["hybrid_max_delta"]) is float and parse_hybrid_overrides(["hybrid_seed=3"]) == {
            "hybrid_seed": 3
        }
        engine_knobs = parse_hybrid_overrides(
            ['hybrid_predictor_kwargs={"beta": 0.8}', "hybrid_dormant_every=4"]
        )
        assert engine_knobs == {"hybrid_predictor_kwargs": {"beta": 0.8}, "hybrid_dormant_every": 4}

    def test_any_annotation_converts_a_json_object_for_a_dict_field(self):
        from typing import Literal

        from hf_hybrid.bench.overrides import convert

        kwargs_type = dict | str | None  # e.g. `hybrid_predictor_kwargs`
        assert convert("f", kwargs_type, '{"rank": 4, "decay": 0.9}') == {"rank": 4, "decay": 0.9}
        assert convert("f", kwargs_type, "null") is None
        assert convert("f", kwargs_type, "rank=4") == "rank=4"  # a string: the field's validation decides
        assert convert("f", int | float, "1.5") == 1.5
        assert convert("f", list[int], "[1, 2]") == [1, 2]
        assert convert("f", Literal["a", "b"], "b") == "b"

    @pytest.mark.parametrize(
        ("item", "message"),
        [
            ("hybrid_warmup_steps=1.5", r"`hybrid_warmup_steps` must be an integer, got '1.5'"),
            ("hybrid_rollback=maybe", r"`hybrid_rollback` must be one of \['true'"),
            ("hybrid_warp=3", r"FIELD one of \[.*'hybrid_warmup_steps'.*got 'hybrid_warp=3'"),
            ("hybrid_warmup_steps", r"expects FIELD=VALUE"),
        ],
    )
    def test_a_bad_override_names_the_field_the_value_and_what_is_allowed(self, item, message):
        from hf_hybrid.bench.overrides import parse_hybrid_overrides

        with pytest.raises(ValueError, match=message):
            parse_hybrid_overrides([item])

    def test_a_dict_field_refuses_what_is_not_a_json_object(self):
        from hf_hybrid.bench.overrides import convert

        with pytest.raises(ValueError, match=r"`f` must be a JSON object, got '\[1\]'"):
            convert("f", dict, "[1]")


def test_the_gpu_task_is_gpt2s_124m_configuration_built_afresh_each_time():
    """The GPU overhead check's model (`scripts/gpu_checks.sh`): 124M parameters, a new model per run
    (a benchmark that handed back a trained model would compare runs that did not start alike)."""
    from hf_hybrid.bench.tasks import get_task

    task = get_task("clm_gpt2_124m").bench_task("tiny")
    first, train, _ = task.build(0)
    second, _, _ = task.build(0)
    assert first is not second
    assert 124_000_000 < sum(p.numel() for p in first.parameters()) < 125_000_000
    assert all(
        p.data_ptr() != q.data_ptr() for p, q in zip(first.parameters(), second.parameters(), strict=True)
    )
    assert max(max(row) for row in train["input_ids"]) < 256  # the byte-level corpus
