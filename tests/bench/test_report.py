"""`report.md` ends with what to do next, groups its notes, and `arena.png` is drawn from a record alone."""

from __future__ import annotations

import copy

import pytest

from hf_hybrid.bench.report import markdown, panel_of, plot, recommendation, short_label


def _verdict(method, verdict, units, seeds=(0,), parent=None, stopped=None):
    per_seed = [
        {"seed": s, "speedup_units": units, "speedup_units_kind": "interpolated", "speedup_time": units}
        for s in seeds
    ]
    return {
        "method": method,
        "lr_multiplier": 2.0,
        "lr_multiplier_of_plain_best": 1.0,
        "seeds": list(seeds),
        "speedup_units": units,
        "speedup_time": units,
        "final_loss_delta": 0.01,
        "verdict": verdict,
        "reason": "",
        "per_seed": per_seed,
        "curve": [],
        "null_control_of": parent,
        "stopped_at": stopped,
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
        "seed_band": None,
    },
    "runs": [],
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
    assert "freeze_bottom(model, 3)" in lines


def test_a_tie_above_one_gets_the_command_that_turns_it_into_a_verdict():
    null = _verdict("null-freeze:3", "ties", 1.3, parent="freeze:3")
    verdicts = [_verdict("freeze:3", "ties", 1.2), _verdict("dropbp", "ties", 0.95), null]
    lines = "\n".join(recommendation(_with(verdicts)))
    assert "No method wins here: keep the plain Trainer, at its tuned learning rate 0.002" in lines
    command = next(line.strip() for line in lines.splitlines() if line.startswith("    hf-hybrid bench"))
    # the user's own flags kept, the seeds and methods replaced (not given twice), a null control no contender
    assert command == (
        "hf-hybrid bench --model_name_or_path m --dataset d.csv --seeds 0 1 2 --methods plain freeze:3"
    )


def test_a_loss_recommends_plain_and_no_more_seeds():
    lines = "\n".join(recommendation(_with([_verdict("freeze:3", "loses", 0.5, stopped=0.5)])))
    assert "keep the plain Trainer" in lines and "--seeds" not in lines


def test_notes_are_grouped_with_their_count():
    data = _with([])
    data["runs"] = [
        {"method": "hybrid", "note": "the run ended inside the warmup", "key": str(i)} for i in range(4)
    ]
    text = markdown({**data, "runs": []})
    assert "Notes from the runs" not in text
    from hf_hybrid.bench.report import _notes

    assert _notes(data)[2] == "- `hybrid`: the run ended inside the warmup (4 runs)"


def test_labels_are_short_and_a_null_is_named_by_its_method():
    row = {
        "method": "null-hybrid:hybrid_confidence_threshold=0.3,hybrid_check_every=0",
        "null_control_of": "hybrid-predict",
    }
    assert short_label(row) == "null of hybrid-predict"
    assert len(short_label({"method": "selective-backprop:start=0,end=1,every=1,rule=uniform"})) <= 30
    assert panel_of("null-hybrid:x=1") == panel_of("hybrid-predict") == "hybrid"


def test_the_plot_is_drawn_from_a_record(tmp_path):
    data = _with([_verdict("freeze:3", "wins", 1.4, (0, 1, 2)), _verdict("dropbp:p=0.5", "loses", 0.6)])
    path = plot(data, tmp_path / "arena.png")
    assert path.stat().st_size > 10_000


def test_a_record_still_running_is_drawn_as_its_points_so_far(tmp_path):
    """No verdict yet: the sweep's and the methods' evaluated points, not an empty forest."""
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
    assert drawn > empty + 5_000  # eight points on five lines


@pytest.mark.parametrize("verdict", ["wins", "ties", "loses"])
def test_the_report_ends_with_what_to_do_next(verdict):
    assert "## What to do next" in markdown(_with([_verdict("freeze:3", verdict, 1.4, (0, 1, 2))]))


def test_the_tuned_rate_gain_is_said_only_against_a_rate_the_user_gave():
    """Without `--learning_rate` the base rate is the range test's centre, not the user's rate."""
    from hf_hybrid.bench.report import _tuning_gain

    runs = [
        {"method": "plain", "seed": 0, "lr_multiplier": m, "point": True, "eval_loss": loss, "kind": "branch",
         "budget": b, "units": 100 * b, "stop": int(200 * b)}
        for m, loss in ((1.0, 3.0), (2.0, 2.0))
        for b in (0.25, 0.5, 0.75, 1.0)
    ]  # fmt: skip
    record = {"runs": runs, "plain": {"best_lr_multiplier": {str(b): 2.0 for b in (0.25, 0.5, 0.75, 1.0)}}}
    assert _tuning_gain({**record, "task": {"learning_rate": None}}, 0.003) is None
    assert "The tuned rate alone" in _tuning_gain({**record, "task": {"learning_rate": 0.003}}, 0.003)


def test_on_a_task_that_overfits_the_recommendation_stops_at_the_best_budget():
    data = _with([_verdict("freeze:3", "ties", 0.9)])
    data["plain"]["best_budget"] = 0.75
    data["protocol"]["budgets"] = {"0.75": {"steps": 150, "fork": 120}, "1.0": {"steps": 200, "fork": 160}}
    lines = "\n".join(recommendation(data))
    assert "keep the plain Trainer, at its tuned learning rate 0.002 for 150 steps" in lines
    assert "lowest at 0.75 of the budget" in lines and "max_steps=150" in lines
    assert '"num_decay_steps": 30' in lines
    winner = _verdict("freeze:3", "wins", 1.4, (0, 1, 2))
    winner["budget"] = 0.75
    lines = "\n".join(recommendation({**data, "verdicts": [winner]}))
    assert "max_steps=150" in lines and "lowest at 0.75" in lines
