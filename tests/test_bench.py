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


class TestTimeIsOnlyReportedWhereMeasurable:
    """Issue 15, item 8: a run too short or too noisy to time says so; a spread from one seed is n/a."""

    @pytest.mark.parametrize(
        ("ratio", "shortest", "noise", "verdict"),
        [
            (1.06, 0.2, 0.09, "too_short"),  # the tiny suite: 0.2 s runs
            (1.06, 30.0, 0.09, "within_noise"),  # |1.06 - 1| <= the measured noise
            (1.30, 30.0, 0.30, "too_noisy"),  # beyond MAX_CLOCK_NOISE the clock itself is not trusted
            (1.30, 30.0, 0.15, "measured"),
            (0.80, 30.0, None, "measured"),  # no noise measured: the ratio stands, the report says so
        ],
    )
    def test_verdict(self, ratio, shortest, noise, verdict):
        from hf_hybrid.bench.suite import time_verdict

        assert time_verdict(ratio, shortest, noise) == verdict

    def test_clock_noise_comes_from_runs_that_did_identical_work(self):
        from hf_hybrid.bench.suite import clock_noise

        def result(budget: float, seconds: float):
            return type("R", (), {"spec": type("S", (), {"budget": budget})(), "train_seconds": seconds})()

        sweep = [result(1.0, 20.0), result(1.0, 21.0), result(0.25, 5.0)]
        per_seed = [
            {"plain_seconds": 20.0, "null": {"time_ratio_vs_plain": 0.94, "backward_skipped_fraction": 0.0}},
            {"plain_seconds": 22.0, "null": {"time_ratio_vs_plain": 0.70, "backward_skipped_fraction": 0.3}},
        ]
        noise = clock_noise(sweep, per_seed)
        assert noise == pytest.approx({"lr_sweep": 0.05, "plain_seeds": 0.10, "null_control": 0.06})
        assert clock_noise(sweep[:1], per_seed[1:]) == {}  # nothing ran twice: not measured

    def _report(self, seeds: int, seconds: float, noise: dict[str, float], speedup: float = 1.3):
        from hf_hybrid.bench.suite import TaskReport, _summarize

        def row(seed: int) -> dict:
            run = {
                "eval_loss": 2.0, "eval_loss_minus_plain": 0.0, "seconds": seconds,
                "speedup_time": speedup + seed / 100, "speedup_time_kind": "interpolated", "speedup_units": 1,
                "speedup_units_kind": "interpolated", "backward_skipped_fraction": 0.0, "rollbacks": 0,
                "extra_memory_ratio": 2.0, "device_peak_bytes": None, "plain_device_peak_bytes": None,
                "time_ratio_vs_plain": 1 / speedup, "wall_ratio_vs_plain": 1 / speedup,
            }  # fmt: skip
            return {"seed": seed, "plain_eval_loss": 2.0 + seed / 10, "plain_seconds": seconds,
                    "hybrid": run, "null": dict(run)}  # fmt: skip

        per_seed = [row(seed) for seed in range(seeds)]
        return TaskReport("clm_stdlib", 2.0, per_seed=per_seed, summary=_summarize(per_seed, noise))

    def test_short_single_seed_runs_print_no_ratio_and_no_spread(self):
        from hf_hybrid.bench.report import markdown, overall

        report = self._report(seeds=1, seconds=0.2, noise={"lr_sweep": 0.09})
        text = markdown([report], {"suite": "tiny", "machine": "cpu"})
        assert "1.30x" not in text and "0.77" not in text
        assert text.count("too short to time (< 5 s)") >= 4  # speed-up and time/plain, hybrid and null
        assert "- clm_stdlib: n/a (1 seed; a spread needs 2 or more)" in text
        assert "hybrid speed-up in time too short to time" in text
        assert overall([report])["hybrid_speedup_time_verdict"] == "too_short"

    def test_measured_runs_print_ratio_range_spread_and_noise(self):
        from hf_hybrid.bench.report import markdown

        report = self._report(seeds=3, seconds=30.0, noise={"lr_sweep": 0.04, "plain_seeds": 0.02})
        text = markdown([report], {"suite": "full", "machine": "cpu"})
        assert "| 1.31x (1.30–1.32) |" in text and "| 0.77 |" in text
        assert "- clm_stdlib: 0.2000" in text
        assert "- clm_stdlib: ±4.0% (lr sweep 4.0%, plain seeds 2.0%)" in text
        assert "hybrid speed-up in time 1.31x" in text

    def test_a_ratio_within_the_clock_noise_or_above_its_limit_is_not_a_result(self):
        from hf_hybrid.bench.report import markdown

        report = self._report(seeds=1, seconds=30.0, noise={"null_control": 0.05}, speedup=1.03)
        text = markdown([report], {"suite": "quick", "machine": "cpu"})
        assert "1.03x" not in text and text.count("within noise (±5%)") == 6  # 4 cells, 2 medians
        report = self._report(seeds=1, seconds=30.0, noise={"null_control": 0.35})
        text = markdown([report], {"suite": "quick", "machine": "cpu"})
        assert "1.30x" not in text and "too noisy to time (±35%)" in text  # above MAX_CLOCK_NOISE


def test_tiny_suite_says_its_runs_are_too_short_to_time(tiny_bench):
    out, _, printed = tiny_bench
    assert "too short to time" in printed and "n/a (1 seed" in printed
    assert "hybrid speed-up in time too short to time" in printed
    summary = json.loads((out / "results.json").read_text())["tasks"][0]["summary"]
    assert summary["hybrid_speedup_time_verdict"] == "too_short"
    assert summary["plain_eval_loss_spread"] is None
    assert "lr_sweep" in summary["clock_noise_sources"]  # the two sweep rates did the same work


def test_the_gpu_task_is_gpt2s_124m_configuration_built_afresh_each_time():
    """The GPU overhead check's model (`scripts/gpu_checks.sh`): 124M parameters, a new model per run
    (a benchmark that handed back a trained model would compare runs that did not start alike)."""
    from hf_hybrid.bench.tasks import get_task

    task = get_task("clm_gpt2_124m")
    first, train, _ = task.build(task.size("tiny"), 0)
    second, _, _ = task.build(task.size("tiny"), 0)
    assert first is not second
    assert 124_000_000 < sum(p.numel() for p in first.parameters()) < 125_000_000
    assert all(
        p.data_ptr() != q.data_ptr() for p, q in zip(first.parameters(), second.parameters(), strict=True)
    )
    assert max(max(row) for row in train["input_ids"]) < 256  # the byte-level corpus
