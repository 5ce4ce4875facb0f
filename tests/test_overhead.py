"""`hf-hybrid bench --overhead --awake`: predict phases open, the share per part is reported and adds up.
No speed is asserted: the numbers are whatever this machine measured."""

from __future__ import annotations

import json

import pytest
import torch

from hf_hybrid.bench.measure.overhead import LLAMA, awake_overrides, llama_task, run_overhead
from hf_hybrid.cli import main


@pytest.fixture(scope="module")
def awake_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("awake")
    # tiny is too short for a tenth of it to leave the warmup and a phase to open: a shorter warmup
    overrides = {"hybrid_warmup_steps": 2, "hybrid_full_steps": 2, "hybrid_min_history": 2}
    path = run_overhead(["clm_stdlib"], "tiny", 1, out, overrides, echo=lambda _: None, awake=True)
    return out, json.loads(path.read_text())


def test_the_awake_runs_predict_with_the_null_predictor(awake_report):
    _, (report,) = awake_report
    pair = report["pairs"][0]
    summary = report["summary"]
    assert summary["awake"] and summary["hybrid_overrides"]["hybrid_predictor"] == "null"
    assert summary["hybrid_overrides"]["hybrid_warmup_steps"] == 2  # the caller's settings win
    assert pair["predicted_steps"] > 0 and 0 < summary["compute_saved_fraction"] < 1
    assert pair["plain_eval_loss"] != pair["hybrid_eval_loss"]  # skipped batches: another run


def test_the_share_is_the_sum_of_its_parts_trainer_hooks_included(awake_report):
    out, (report,) = awake_report
    pair = report["pairs"][0]
    parts = pair["part_shares"]
    assert {"trainer", "optimizer_wrapper", "score", "decide"} <= set(parts)
    assert pair["engine_time_share"] == pytest.approx(sum(parts.values()))
    assert pair["engine_seconds"] == pytest.approx(pair["engine_time_share"] * pair["step_seconds"])
    assert report["summary"]["median_share"] == pair["engine_time_share"]
    table = (out / "overhead.md").read_text()
    assert "| trainer |" in table and "| optimizer_wrapper |" in table and (out / "overhead.png").exists()


def test_awake_overrides_leave_the_warmup_within_the_run():
    assert awake_overrides("minilm_cls", "full") == {
        "hybrid_predictor": "null",
        "hybrid_confidence_threshold": 0.0,
        "hybrid_warmup_steps": 20,
    }
    assert awake_overrides(LLAMA, "tiny")["hybrid_warmup_steps"] == 2  # clm_stdlib's budget


def test_the_llama_task_is_another_architecture_on_the_clm_data():
    task = llama_task("tiny")
    model = task.build_model(0)
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.num_hidden_layers == 3
    assert task.max_steps == 20 and task.task_type == "causal_lm"
    first, again = task.build_model(1), task.build_model(1)
    assert all(torch.equal(a, b) for a, b in zip(first.parameters(), again.parameters(), strict=True))


def test_the_awake_flag_reaches_the_overhead_run(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(
        "hf_hybrid.bench.measure.overhead.run_overhead", lambda *args, **kwargs: calls.append((args, kwargs))
    )
    assert main(["bench", "--overhead", "--awake", "--suite", "tiny", "--out", str(tmp_path)]) == 0
    assert main(["bench", "--overhead", "--suite", "tiny", "--out", str(tmp_path)]) == 0
    assert [kwargs["awake"] for _, kwargs in calls] == [True, False]
