"""`report.md` ends with what to do next, states the resolution and the bands, groups its notes, and
`arena.png` is drawn from a record alone."""

from __future__ import annotations

import copy
import math

import pytest

from hf_hybrid.bench.report import (
    _method_panel,
    _notes,
    arguments,
    markdown,
    plot,
    recommendation,
    resolution_lines,
    short_label,
)


def _verdict(method, verdict, units, seeds=(0,), parent=None, stopped=None):
    return {
        "method": method,
        "lr_multiplier": 2.0,
        "lr_multiplier_of_plain": 1.0,
        "seeds": list(seeds),
        "budget": stopped or 1.0,
        "speedup_units": units,
        "speedup_units_kind": "interpolated",
        "speedup_time": units,
        "loss_delta": 0.01,
        "band": {"low": 0.9, "high": 1.1},
        "verdict": verdict,
        "reason": "",
        "cost_plain_runs": 1.5,
        "per_seed": [{"seed": s, "loss_delta": 0.01} for s in seeds],
        "curve": [
            {"budget": b, "units": 100 * b, "eval_loss": 3.0 - b, "speedup_units": units} for b in (0.5, 1.0)
        ],
        "null_control_of": parent,
        "stopped_at": stopped,
        "same_trajectory": False,
    }


RECORD = {
    "task": {"name": "t", "max_steps": 200, "learning_rate": 1e-3},
    "command": "hf-hybrid bench --model_name_or_path m --dataset d.csv --methods plain freeze:3",
    "machine": "cpu",
    "protocol": {"cooldown_fraction": 0.2, "decay_shape": "1-sqrt"},
    "calibration": {"units": {"step": 2.0}},
    "decisions": {"base_learning_rate": 1e-3},
    "plain": {
        "best_lr_multiplier": {"0.25": 4.0, "0.5": 2.0, "0.75": 2.0, "1.0": 2.0},
        "seeds": [0],
        "eval_loss": 1.0,
        "eval_loss_by_seed": {"0": 1.0},
        "mode": "wsd",
    },
    "runs": [
        {
            "key": f"plain {b}",
            "method": "plain",
            "seed": 0,
            "lr_multiplier": m,
            "learning_rate": 1e-3 * m,
            "budget": b,
            "point": True,
            "eval_loss": 3.0 - b,
            "kind": "branch",
            "start": 0,
            "stop": int(200 * b),
            "steps": int(200 * b),
            "units": 100 * b,
            "seconds": b,
        }
        for b, m in ((0.25, 4.0), (0.5, 2.0), (0.75, 2.0), (1.0, 2.0))
    ],  # fmt: skip
    "notes": [],
}


def _with(verdicts):
    data = copy.deepcopy(RECORD)
    data["verdicts"] = [_verdict("plain", "baseline", 1.0), *verdicts]
    return data


def test_a_win_is_recommended_as_arguments_at_its_rate():
    lines = "\n".join(recommendation(_with([_verdict("freeze:3", "wins", 1.4, (0, 1, 2))])))
    assert "`freeze:3` wins: 1.40x in compute units" in lines
    assert "learning_rate=0.002" in lines and 'lr_scheduler_type="warmup_stable_decay"' in lines
    assert '"num_decay_steps": 40' in lines  # the cooldown of the full budget, 0.2 of 200 steps
    assert "freeze_bottom(model, 3)" in lines


def test_an_unresolved_verdict_with_one_seed_gets_the_command_that_resolves_it():
    null = _verdict("null-freeze:3", "unresolved", 1.3, parent="freeze:3")
    verdicts = [_verdict("freeze:3", "unresolved", 1.2), _verdict("dropbp", "ties", 0.95), null]
    data = _with(verdicts)
    data["command"] += " --seeds 0 --out x"
    lines = "\n".join(recommendation(data))
    assert "No method wins here: keep the plain Trainer, at its raced learning rate 0.002" in lines
    command = next(line.strip() for line in lines.splitlines() if line.startswith("    hf-hybrid bench"))
    # the user's own flags kept, the seeds replaced (not given twice)
    flags = "--model_name_or_path m --dataset d.csv --methods plain freeze:3 --out x --seeds 0 1 2"
    assert command == f"hf-hybrid bench {flags}"


def test_a_tie_or_a_loss_recommends_plain_and_no_more_seeds():
    for verdict in (_verdict("freeze:3", "loses", 0.5, stopped=0.5), _verdict("freeze:3", "ties", 1.05)):
        lines = "\n".join(recommendation(_with([verdict])))
        assert "keep the plain Trainer" in lines and "--seeds" not in lines


def test_a_record_that_fell_back_to_the_task_s_schedule_recommends_it():
    data = _with([])
    data["plain"]["mode"] = "separate"
    data["task"]["lr_scheduler_type"] = "cosine"
    lines = "\n".join(recommendation(data))
    assert 'lr_scheduler_type="cosine"' in lines and "warmup_stable_decay" not in lines


def test_the_verdict_table_shows_each_band_and_what_each_method_cost():
    text = markdown(_with([_verdict("freeze:3", "loses", 0.7, stopped=0.5)]))
    row = next(line for line in text.splitlines() if line.startswith("| `freeze:3` |"))
    assert "| 0.90–1.10x |" in row and "**loses (stopped at 0.5)**" in row and row.endswith("| 1.50 |")


def test_the_resolution_and_what_would_reach_the_target_are_stated():
    resolution = {
        "seeds": 3, "resolution": 1.3, "slope": 0.2, "seed_se": 0.01, "eval_se": 0.02, "grid": 0.01,
        "seeds_for_target": 9, "eval_factor_for_target": 2.5,
    }  # fmt: skip
    lines = "\n".join(resolution_lines({"plain": {"resolution": resolution}}))
    assert "**Resolution: 1.30x** at 3 seed(s)" in lines
    assert "To resolve 1.15x it would take 9 seeds or 2.5x the eval clusters at 3 seed(s)." in lines
    flat = resolution_lines({"plain": {"resolution": {**resolution, "slope": -0.01}}})
    assert flat[0].startswith("**Resolution: none**")
    assert "`--eval_group_column`" in lines  # no eval clusters: each example counted as independent
    both = {**resolution, "seeds_for_target": None, "eval_factor_for_target": None}
    both["seeds_and_eval_for_target"] = [[20, 2.0], [10, 3.0]]
    text = "\n".join(resolution_lines({"plain": {"resolution": both}}))
    expected = "both more seeds and more eval data: 20 seeds with 2x the eval clusters, or 10 seeds with 3x"
    assert expected in text
    clustered = "\n".join(resolution_lines({"plain": {"resolution": resolution}, "eval_clusters": [0, 0, 1]}))
    assert "`--eval_group_column`" not in clustered


def test_with_one_seed_the_resolution_is_unknown_and_says_how_to_learn_it():
    """One plain seed shows no run-to-run spread and no pair of plain runs to bootstrap: the report says
    so and how to learn it, not an infinite resolution and an infinite eval set."""
    one = {
        "seeds": 1, "resolution": math.inf, "slope": 0.7, "seed_se": None, "eval_se": math.inf, "grid": 0.0,
        "seeds_for_target": None, "eval_factor_for_target": math.inf,
    }  # fmt: skip
    text = "\n".join(resolution_lines({"plain": {"resolution": one}}))
    assert text.startswith("**Resolution: unknown at 1 seed**") and "`--seeds 0 1 2`" in text
    assert "inf" not in text and "To resolve" not in text


def test_notes_are_grouped_with_their_count():
    data = _with([])
    data["runs"] = [
        {"method": "hybrid", "note": "the run ended inside the warmup", "key": str(i)} for i in range(4)
    ]
    text = markdown({**data, "runs": []})
    assert "Notes from the runs" not in text
    assert _notes(data)[2] == "- `hybrid`: the run ended inside the warmup (4 runs)"


def test_labels_are_short_and_a_null_is_named_by_its_method():
    row = {
        "method": "null-hybrid:hybrid_confidence_threshold=0.3,hybrid_check_every=0",
        "null_control_of": "hybrid-predict",
    }
    assert short_label(row) == "null of hybrid-predict"
    assert len(short_label({"method": "selective-backprop:start=0,end=1,every=1,rule=uniform"})) <= 30


def test_the_plot_is_drawn_from_a_record(tmp_path):
    data = _with([_verdict("freeze:3", "wins", 1.4, (0, 1, 2)), _verdict("dropbp:p=0.5", "loses", 0.6)])
    empty = plot({**_with([]), "runs": []}, tmp_path / "empty.png").stat().st_size
    drawn = plot(data, tmp_path / "arena.png").stat().st_size
    assert drawn > empty + 5_000  # the bands, the points, the frontier and the methods' curves


def test_a_panel_draws_the_envelope_the_verdicts_read_flat_to_plain_s_last_point():
    """Plain's ¾ point above its ½ one (a small, noisy eval set) is not its frontier: the envelope stays
    flat at the ½ loss out to the full budget's cost, and a method point far above is still shown."""
    from matplotlib.figure import Figure

    points = [(30.0, 0.77), (60.0, 0.57), (90.0, 0.78), (120.0, 0.57)]
    row = {
        "method": "freeze:3",
        "curve": [{"units": 20.0, "eval_loss": 0.78}, {"units": 90.0, "eval_loss": 1.07}],
    }
    axis = Figure().add_subplot()
    _method_panel(axis, row, points)
    lines = {line.get_label(): list(zip(*line.get_data(), strict=True)) for line in axis.get_lines()}
    assert lines["plain frontier"] == [(30.0, 0.77), (60.0, 0.57), (120.0, 0.57)]
    assert lines["plain's points"] == points
    assert axis.get_ylim()[1] > 1.07


def test_a_record_still_running_is_drawn_as_its_points_so_far(tmp_path):
    """No verdict yet: plain's race per rate and the methods' evaluated points, not an empty figure."""
    runs = [
        {"method": m, "seed": 0, "lr_multiplier": r, "point": True, "eval_loss": 3.0 - b + 0.1 * r,
         "kind": "branch", "budget": b, "units": 100 * b}
        for m in ("plain", "freeze:3")
        for r in (1.0, 2.0)
        for b in (0.25, 0.5)
    ]  # fmt: skip
    record = {"task": {"name": "t"}, "protocol": {"seeds": [0, 1]}, "verdicts": []}
    empty = plot({**record, "runs": []}, tmp_path / "empty.png").stat().st_size
    drawn = plot({**record, "runs": runs}, tmp_path / "arena.png").stat().st_size
    assert drawn > empty + 5_000  # eight points on four lines


@pytest.mark.parametrize("verdict", ["wins", "ties", "loses"])
def test_the_report_ends_with_what_to_do_next(verdict):
    assert "## What to do next" in markdown(_with([_verdict("freeze:3", verdict, 1.4, (0, 1, 2))]))


@pytest.mark.parametrize(
    ("method", "expected"),
    [
        ("packing", "DataCollatorWithFlattening()"),
        ("packing:rows", "PackedRows(128, tokenizer.pad_token_id)"),
        ("packing-naive", "ConcatenatedRows(128, tokenizer.pad_token_id)"),
        ("group_by_length", 'train_sampling_strategy="group_by_length"'),
    ],
)
def test_the_code_to_paste_carries_each_layout_method_s_collator_or_argument(method, expected):
    assert expected in "\n".join(arguments(method, 1e-4, 400, {}, None, 128))
