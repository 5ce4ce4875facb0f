"""The benchmark: frontier maths, replayed control phases, a tiny suite end to end (no timing asserted)."""

from __future__ import annotations

import json
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
            ["hybrid_predictor=lowrank", "hybrid_warmup_steps=5", "hybrid_max_delta=0.1",
             "hybrid_rollback=false", "hybrid_seed=none"]
        )  # fmt: skip
        assert got == {"hybrid_predictor": "lowrank", "hybrid_warmup_steps": 5, "hybrid_max_delta": 0.1,
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


@pytest.fixture(scope="module")
def tiny_bench(tmp_path_factory):
    from hf_hybrid.bench import run_bench

    out = tmp_path_factory.mktemp("bench")
    lines: list[str] = []
    overrides = {"hybrid_warmup_steps": 5, "hybrid_full_steps": 2, "hybrid_confidence_threshold": 0.0,
                 "hybrid_min_history": 3, "hybrid_max_predict_steps": 4}  # fmt: skip
    paths = run_bench("tiny", out=out, hybrid_overrides=overrides, echo=lines.append)
    return out, paths, "\n".join(lines)


def test_tiny_suite_writes_json_report_and_plot(tiny_bench):
    out, paths, printed = tiny_bench
    results = json.loads((out / "results.json").read_text())
    (task,) = results["tasks"]
    kinds = sorted({(r["spec"]["kind"], r["spec"]["budget"]) for r in task["runs"]})
    assert ("hybrid", 1.0) in kinds and ("null", 1.0) in kinds
    assert {b for k, b in kinds if k == "plain"} == {0.25, 0.5, 0.75, 1.0}
    assert {r["spec"]["lr_multiplier"] for r in task["runs"] if r["spec"]["kind"] == "plain"} == {1.0, 2.0}
    assert "| clm_stdlib |" in printed and "| hybrid |" in printed and "| null |" in printed
    assert (out / "clm_stdlib.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert paths["markdown"].read_text() in printed


def test_null_control_replays_the_hybrid_phases_and_applies_nothing(tiny_bench):
    out, _, _ = tiny_bench
    runs = json.loads((out / "results.json").read_text())["tasks"][0]["runs"]
    hybrid = next(r for r in runs if r["spec"]["kind"] == "hybrid")
    null = next(r for r in runs if r["spec"]["kind"] == "null")
    assert "predict" in hybrid["phases"]
    assert null["phases"] == hybrid["phases"]
    assert null["stats"]["backward_skipped"] == hybrid["stats"]["backward_skipped"]
    assert null["stats"]["predictor_bytes"] == 0


def test_compute_units_follow_the_phase_counts(tiny_bench):
    out, _, _ = tiny_bench
    runs = json.loads((out / "results.json").read_text())["tasks"][0]["runs"]
    for run in runs:
        if run["spec"]["kind"] == "plain":
            assert run["compute_units"] == 3 * run["steps"]
        else:
            stats = run["stats"]
            assert run["compute_units"] == 3 * stats["backward_run"] + stats["predict_checked"]
            assert run["compute_units"] < 3 * run["steps"]


class _FakeResult:
    def __init__(self, multiplier: float, loss: float) -> None:
        self.spec = type("Spec", (), {"lr_multiplier": multiplier})()
        self.eval_loss = loss


@pytest.mark.parametrize(
    ("losses", "tried"),
    [
        ({0.5: 3.0, 1.0: 2.8, 2.0: 2.6}, [4.0, 8.0]),  # best at the top edge twice: widened twice
        ({0.5: 2.5, 1.0: 2.8, 2.0: 2.9}, [0.25]),  # best at the bottom edge, then inside
        ({0.5: 3.0, 1.0: 2.5, 2.0: 2.9}, []),  # best inside: nothing more to try
    ],
)
def test_the_lr_sweep_widens_while_its_best_rate_is_at_an_edge(losses, tried):
    from hf_hybrid.bench.suite import _widen_sweep

    curve = {0.25: 2.6, 4.0: 2.5, 8.0: 2.4}  # what the extra rates would give
    asked: list[float] = []

    def try_multiplier(m: float) -> _FakeResult:
        asked.append(m)
        return _FakeResult(m, curve[m])

    sweep = _widen_sweep([_FakeResult(m, loss) for m, loss in losses.items()], try_multiplier, extensions=2)
    assert asked == tried
    assert len(sweep) == len(losses) + len(tried)


def test_engine_memory_counts_the_predict_phase_snapshot(tiny_bench):
    out, _, _ = tiny_bench
    runs = json.loads((out / "results.json").read_text())["tasks"][0]["runs"]
    hybrid = next(r for r in runs if r["spec"]["kind"] == "hybrid")
    plain = next(r for r in runs if r["spec"]["kind"] == "plain")
    assert plain["engine_peak_bytes"] == 0
    # Once a predict phase has opened, the engine holds the rollback snapshot of every trainable tensor
    # (kept for the next phase) next to the last weights and the EMA predictor's buffer.
    assert hybrid["stats"]["predictor"] == "ema"
    assert hybrid["stats"]["predictor_bytes"] == hybrid["trainable_bytes"]
    assert hybrid["engine_peak_bytes"] >= hybrid["engine_bytes"] >= 3 * hybrid["trainable_bytes"]


def test_cpu_runs_are_timed_by_the_process_cpu_clock_with_wall_clock_kept(tiny_bench):
    out, _, _ = tiny_bench
    for run in json.loads((out / "results.json").read_text())["tasks"][0]["runs"]:
        assert run["clock"] == "cpu_time"
        assert run["train_seconds"] > 0 and run["wall_seconds"] > 0
        assert run["curve"][-1]["seconds"] == run["train_seconds"]  # the final evaluation is not subtracted
