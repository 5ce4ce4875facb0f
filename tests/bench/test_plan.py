"""The protocol applied to a record, end to end, on runs whose eval losses are written by hand (an executor
that trains nothing: `fake_arena.py`): the races, the reading at the full budget, the early stop, the
other seeds, null controls, same-trajectory methods, the schedule check, noise planted where two methods
are identical, costs, and a kill anywhere."""

from __future__ import annotations

import json
import math
import random
import shutil

import pytest
from fake_arena import Fake, plain_loss, run, verdict_of

from hf_hybrid.bench import protocol as rules
from hf_hybrid.bench.report import markdown


def test_plain_s_race_decides_its_frontier_and_the_winner_alone_reaches_the_full_budget(tmp_path):
    data, executor = run(tmp_path, ["plain"], lambda m, r, b, s: plain_loss(r, b, s), seeds=(0,))
    assert data["plain"]["best_lr_multiplier"] == {"0.25": 2.0, "0.5": 2.0, "0.75": 2.0, "1.0": 2.0}
    rungs = data["decisions"]["plain"]["rungs"]
    assert rungs == {"0.25": [0.5, 1.0, 2.0, 4.0], "0.5": [1.0, 2.0]}
    trunk_ends = [k for k in executor.ran if "segment" in k and "-200 of 200" in k]
    assert len(trunk_ends) == 1 and "lr 0.002 " in trunk_ends[0]


def test_the_race_ranks_by_eval_loss_not_by_time(tmp_path):
    """A rate whose runs take less time but reach a worse loss must not win a rung."""

    def seconds(spec):
        return 1.0 if spec.lr_multiplier == 4.0 else 100.0

    executor = Fake(lambda m, r, b, s: plain_loss(r, b, s), seconds=seconds)
    data, _ = run(tmp_path, ["plain"], None, seeds=(0,), executor=executor)
    assert data["plain"]["best_lr_multiplier"]["0.25"] == 2.0


def test_a_method_is_raced_by_plain_s_rules_around_plain_s_rate(tmp_path):
    def loss(m, r, b, s):  # the method's own best rate is x4: its race must find it, interior
        best = 4.0 if m == "freeze:2" else 2.0
        return 3.0 - b + 0.05 * math.log2(r / best) ** 2 + 0.003 * s

    data, _ = run(tmp_path, ["plain", "freeze:2"], loss, seeds=(0,))
    race = data["decisions"]["methods"]["freeze:2"]["race"]
    assert race["rungs"]["0.25"] == [1.0, 2.0, 4.0, 8.0]  # x4 at the top edge of x1-x4: widened
    assert race["best"]["1.0"] == 4.0 and race["untuned"] == {}
    assert verdict_of(data, "freeze:2")["lr_multiplier_of_plain"] == 2.0


def test_a_method_whose_race_ends_at_an_edge_is_untuned_never_a_win(tmp_path):
    def loss(m, r, b, s):  # ever better at a larger rate (the slope beats plain's bowl): no interior best
        return plain_loss(r, b, s) - (0.2 + 0.5 * math.log2(r) if m == "freeze:2" else 0.0)

    data, _ = run(tmp_path, ["plain", "freeze:2"], loss, widen=1)
    verdict = verdict_of(data, "freeze:2")
    assert verdict["verdict"] == rules.UNTUNED and "untuned" in verdict["reason"]


def test_every_verdict_reads_the_full_budget_paired_with_plain_s_seeds(tmp_path):
    def loss(m, r, b, s):  # better than plain by 0.1 at 3/4 but only 0.02 at the end: read at the end
        gain = {0.75: 0.1, 1.0: 0.02}.get(b, 0.0) if m == "freeze:2" else 0.0
        return plain_loss(r, b, s) - gain

    data, _ = run(tmp_path, ["plain", "freeze:2"], loss)
    verdict = verdict_of(data, "freeze:2")
    assert verdict["budget"] == 1.0
    assert verdict["loss_delta"] == pytest.approx(-0.02)
    for seed in verdict["per_seed"]:  # each seed against plain's run of that seed, not the first seed's
        assert seed["loss_delta"] == pytest.approx(-0.02)
        assert seed["plain_eval_loss"] == pytest.approx(plain_loss(2.0, 1.0, seed["seed"]))


def test_a_method_far_below_plain_at_half_stops_there_and_loses(tmp_path):
    def loss(m, r, b, s):
        return plain_loss(r, b, s) + (0.4 if m == "freeze:2" else 0.0)

    data, executor = run(tmp_path, ["plain", "freeze:2"], loss)
    verdict = verdict_of(data, "freeze:2")
    assert verdict["verdict"] == rules.LOSES and verdict["stopped_at"] == 0.5
    assert not any(k.startswith("freeze:2") and "-200 of 200" in k for k in executor.ran)


def test_a_method_that_may_win_gets_the_other_seeds_and_wins_past_the_band(tmp_path):
    def loss(m, r, b, s):
        return plain_loss(r, b, s) - (0.15 if m == "freeze:2" else 0.0)

    data, _ = run(tmp_path, ["plain", "freeze:2"], loss)
    verdict = verdict_of(data, "freeze:2")
    assert verdict["seeds"] == [0, 1, 2]
    assert verdict["verdict"] == rules.WINS, verdict["reason"]


def test_a_tie_within_the_band_stays_on_one_seed(tmp_path):
    # its steps cost 2/3 of plain's: at +b/3 it reaches what plain reaches for the same compute
    data, _ = run(
        tmp_path, ["plain", "freeze:2"], lambda m, r, b, s: plain_loss(r, b, s) + b / 3 * (m != "plain")
    )
    verdict = verdict_of(data, "freeze:2")
    assert verdict["seeds"] == [0] and verdict["verdict"] == rules.TIES


@pytest.mark.parametrize("seeds", [(0,), (0, 1), (0, 1, 2)])
def test_a_method_identical_to_plain_reads_a_tie_at_every_seed_count(tmp_path, seeds):
    """Planted noise: `freeze:2` here trains plain's runs to the last digit, under another name, priced as
    plain; its own per-example draws are plain's too. It must never read a win or a loss."""
    executor = Fake(lambda m, r, b, s: plain_loss(r, b, s), aliases={"freeze:2": "plain"})
    data, _ = run(tmp_path, ["plain", "freeze:2"], None, seeds=seeds, executor=executor)
    verdict = verdict_of(data, "freeze:2")
    assert verdict["verdict"] == rules.TIES, verdict["reason"]
    assert verdict["speedup_units"] == pytest.approx(1.0)


@pytest.mark.parametrize("seeds", [(0,), (0, 1, 2)])
def test_an_identity_reads_1x_where_plain_s_own_frontier_turns_up(tmp_path, seeds):
    """Plain's eval loss rises from 3/4 to the full budget (it overtrains): the reading budget is fixed
    from plain's runs alone at 3/4, the other seeds run there, and plain under another name reads 1.00x
    and a tie (the full budget's loss read on an envelope that reached it earlier read 0.55x)."""

    def overtrained(m, r, b, s):
        return plain_loss(r, b, s) + (0.4 if b == 1.0 else 0.0)

    executor = Fake(lambda m, r, b, s: overtrained(m, r, b, s), aliases={"freeze:2": "plain"})
    data, ran = run(tmp_path, ["plain", "freeze:2"], None, seeds=seeds, executor=executor)
    assert data["plain"]["read_at"] == 0.75 and data["decisions"]["read_at"] == 0.75
    verdict = verdict_of(data, "freeze:2")
    assert verdict["speedup_units"] == pytest.approx(1.0) and verdict["verdict"] == rules.TIES
    assert verdict["budget"] == 0.75
    others = [k for k in ran.ran if k.startswith("plain") and "seed 0" not in k]
    assert all("0-150 of 150" in k for k in others) and len(others) == len(seeds) - 1  # 3/4 of 200


@pytest.mark.parametrize("seeds", [(0, 1), (0, 1, 2)])
def test_a_method_as_good_as_plain_with_its_own_noise_reads_a_tie(tmp_path, seeds):
    """Planted noise: a method whose loss is plain's plus its own seed noise as large as plain's (drawn
    independently) and whose eval examples have their own noise: a tie, not a win or a loss."""

    def loss(m, r, b, s):
        own = {0: 0.004, 1: -0.002, 2: 0.001}[s] if m == "freeze:2" else 0.0
        return plain_loss(r, b, s) + own + b / 3 * (m == "freeze:2")  # its cheaper steps, at equal cost

    data, _ = run(tmp_path, ["plain", "freeze:2"], loss, seeds=seeds)
    assert verdict_of(data, "freeze:2")["verdict"] == rules.TIES


def test_with_one_seed_a_reading_outside_the_known_band_is_unresolved(tmp_path):
    def loss(m, r, b, s):
        return plain_loss(r, b, s) - (0.15 if m == "freeze:2" else 0.0)

    data, _ = run(tmp_path, ["plain", "freeze:2"], loss, seeds=(0,))
    verdict = verdict_of(data, "freeze:2")
    assert verdict["verdict"] == rules.UNRESOLVED and "2 or more seeds" in verdict["reason"]
    assert "--seeds 0 1 2" in markdown(data)


def test_a_same_trajectory_method_is_judged_in_time_on_interleaved_timed_pairs(tmp_path):
    def seconds(spec):
        return (spec.stop - spec.start) * (0.5 if spec.method.startswith("args:") else 1.0)

    executor = Fake(
        lambda m, r, b, s: plain_loss(r, b, s), aliases={"args:torch_compile=true": "plain"}, seconds=seconds
    )
    data, ran = run(tmp_path, ["plain", "args:torch_compile=true"], None, executor=executor)
    verdict = verdict_of(data, "args:torch_compile=true")
    assert verdict["same_trajectory"] and verdict["verdict"] == rules.WINS
    assert verdict["speedup_time"] == pytest.approx(2.0) and verdict["timing"]["pairs"] == rules.TIMED_PAIRS
    mine = [k for k in ran.ran if k.startswith("args:")]
    assert len(mine) == 1 + rules.TIMED_PAIRS and all("0-50 of 50" in k for k in mine)  # a quarter each
    timed = [k for k in ran.ran if "repeat" in k]
    order = [("plain" if k.startswith("plain") else "args", int(k.rsplit("repeat ", 1)[1])) for k in timed]
    assert order == [(side, r) for r in range(1, 6) for side in ("plain", "args")]  # interleaved rounds
    # its evaluated quarter and its five timed runs, costed by their time (half plain's: 0.125 each, where
    # its price says 0.25), and plain's five timed runs (0.25 each) are its cost, not plain's
    assert verdict["cost_plain_runs"] == pytest.approx(6 * 0.125 + 5 * 0.25, rel=0.01)
    assert "same_trajectory_reference" not in data["plain"]["cost_plain_runs"]


def test_an_identity_of_plain_s_trajectory_ties_in_time_on_a_noisy_clock(tmp_path):
    """The A/A test end to end on the fake arena: the same work timed with +-10% noise per run (as a
    loaded machine gives) reads a tie, where two runs' max/min could read a win."""
    draw = random.Random(3)

    def seconds(spec):
        return (spec.stop - spec.start) * draw.uniform(0.9, 1.1)

    fused = "args:optim=adamw_torch_fused"
    executor = Fake(lambda m, r, b, s: plain_loss(r, b, s), aliases={fused: "plain"}, seconds=seconds)
    data, _ = run(tmp_path, ["plain", fused], None, executor=executor)
    verdict = verdict_of(data, fused)
    assert verdict["same_trajectory"] and verdict["verdict"] == rules.TIES, verdict["reason"]
    assert verdict["band"]["low"] < 1 < verdict["band"]["high"]


def test_a_timed_pair_split_across_invocations_does_not_count(tmp_path):
    """A killed arena leaves a round half run: on resume that round is timed again in one invocation,
    never read against a plain run timed on another machine load."""
    compiled = "args:torch_compile=true"
    executor = Fake(lambda m, r, b, s: plain_loss(r, b, s), aliases={compiled: "plain"})
    run(tmp_path, ["plain", compiled], None, executor=executor)
    record = json.loads((tmp_path / "results.json").read_text())
    split = next(r for r in record["runs"] if r["method"] == "plain" and r["spec"]["repeat"] == 2)
    split["invocation"] = "another-invocation"
    (tmp_path / "results.json").write_text(json.dumps(record))
    data, again = run(
        tmp_path,
        ["plain", compiled],
        None,
        executor=Fake(lambda m, r, b, s: plain_loss(r, b, s), aliases={compiled: "plain"}),
    )
    timing = verdict_of(data, compiled)["timing"]
    assert timing["pairs"] == rules.TIMED_PAIRS and 2 not in timing["repeats"] and 6 in timing["repeats"]
    assert sorted(k.rsplit("repeat ", 1)[1] for k in again.ran) == ["6", "6"]


def test_a_same_trajectory_method_that_leaves_plain_s_trajectory_is_raced(tmp_path):
    def loss(m, r, b, s):
        # its steps cost half of plain's: +0.8 is worse than plain at half its budget (+0.5)
        return plain_loss(r, b, s) + (0.8 if m.startswith("args:") else 0.0)

    data, _ = run(tmp_path, ["plain", "args:torch_compile=true"], loss)
    verdict = verdict_of(data, "args:torch_compile=true")
    assert not verdict["same_trajectory"] and verdict["verdict"] == rules.LOSES
    assert data["decisions"]["methods"]["args:torch_compile=true"]["same_trajectory"]["matches"] is False


def test_the_schedule_check_runs_once_at_one_rate_and_keeps_the_trunk(tmp_path):
    data, executor = run(
        tmp_path, ["plain"], lambda m, r, b, s: plain_loss(r, b, s), seeds=(0,), schedule_check=True
    )
    checks = [k for k in executor.ran if "separate linear" in k]
    assert len(checks) == 1 and "lr 0.002 " in checks[0] and "0-100 of 100" in checks[0]  # half the budget
    assert data["decisions"]["mode"] == "wsd" and data["decisions"]["schedule_check"]["fallback"] is False
    assert data["plain"]["cost_plain_runs"]["schedule_check"] == pytest.approx(0.5)


def test_a_trunk_branch_recorded_without_its_per_example_losses_is_measured_again_for_the_check(tmp_path):
    """A record from before the check read the ½ branch: the branch runs again (its trunk's checkpoint
    rebuilt), and the check pairs it, rather than reading an infinite error that can never fall back."""
    executor = Fake(lambda m, r, b, s: plain_loss(r, b, s), own_schedule=-0.2)
    data, _ = run(tmp_path, ["plain"], None, seeds=(0,), executor=executor, schedule_check=False)
    for row in data["runs"]:
        if row["budget"] == 0.5:
            row["eval_example_losses"] = None
    (tmp_path / "results.json").write_text(json.dumps(data))
    for folder in tmp_path.rglob("checkpoint-*"):
        shutil.rmtree(folder)
    data, executor = run(tmp_path, ["plain"], None, seeds=(0,), executor=executor, schedule_check=True)
    again = [k for k in executor.ran if "branch" in k and "of 100" in k]
    assert again and data["decisions"]["schedule_check"]["fallback"] is True


def test_a_trunk_worse_than_the_task_s_own_schedule_sends_every_run_to_separate_runs(tmp_path):
    executor = Fake(lambda m, r, b, s: plain_loss(r, b, s), own_schedule=-0.2)
    data, _ = run(tmp_path, ["plain", "freeze:2"], None, seeds=(0,), executor=executor, schedule_check=True)
    assert data["decisions"]["mode"] == "separate" and data["decisions"]["schedule_check"]["fallback"]
    used = [r for r in data["runs"] if r["key"] not in data["unused"] and r["method"] == "freeze:2"]
    assert used and all(r["kind"] == "separate" for r in used)
    assert 'lr_scheduler_type="linear"' in markdown(data)


def test_the_record_states_the_resolution_and_what_each_part_cost(tmp_path):
    data, _ = run(
        tmp_path, ["plain", "freeze:2"], lambda m, r, b, s: plain_loss(r, b, s) - 0.15 * (m != "plain")
    )
    resolution = data["plain"]["resolution"]
    assert resolution["seeds"] == 3 and 1.0 < resolution["resolution"] < 1.5
    cost = data["plain"]["cost_plain_runs"]
    assert cost["other_seeds"] == pytest.approx(2.0)  # two full runs, one per other seed
    assert cost["total"] == pytest.approx(sum(v for k, v in cost.items() if k != "total"))
    assert verdict_of(data, "freeze:2")["cost_plain_runs"] > 0
    text = markdown(data)
    assert "**Resolution:" in text and "Plain's part cost" in text


def test_a_record_moved_under_another_out_costs_what_it_did(tmp_path):
    """A trunk recorded at two paths (the record moved, then resumed) is still one trunk: each segment
    costs only its own steps."""
    data, _ = run(tmp_path, ["plain"], lambda m, r, b, s: plain_loss(r, b, s), seeds=(0,))
    before = data["plain"]["cost_plain_runs"]
    for row in data["runs"]:
        if row["spec"].get("trunk_dir") and row["start"] == 0:
            row["spec"]["trunk_dir"] = row["spec"]["trunk_dir"].replace(str(tmp_path), str(tmp_path / "old"))
    (tmp_path / "results.json").write_text(json.dumps(data))
    moved, executor = run(tmp_path, ["plain"], lambda m, r, b, s: plain_loss(r, b, s), seeds=(0,))
    assert not executor.ran and moved["plain"]["cost_plain_runs"] == pytest.approx(before)


def test_a_changed_rule_reaches_the_record_and_the_report(tmp_path, monkeypatch):
    monkeypatch.setattr(rules, "SPACING", 4.0)
    data, _ = run(
        tmp_path,
        ["plain"],
        lambda m, r, b, s: plain_loss(r, b, s),
        seeds=(0,),
        lr_multipliers=(0.25, 1.0, 4.0),
    )
    assert data["protocol"]["rules"]["widening while the best sits at an edge"].startswith("x4 a step")
    assert "x4 a step" in markdown(data)


@pytest.mark.parametrize("stop_after", [1, 7, 19, 31])
def test_an_arena_stopped_anywhere_and_rerun_is_the_uninterrupted_one(tmp_path, stop_after):
    def loss(m, r, b, s):
        return plain_loss(r, b, s) + {"freeze:2": -0.15, "dropbp:p=0.5": 0.4}.get(m, 0.0)

    methods = ["plain", "freeze:2", "dropbp:p=0.5"]
    whole, _ = run(tmp_path / "whole", methods, loss)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "killed", methods, None, executor=Fake(loss, stop_after=stop_after))
    again, _ = run(tmp_path / "killed", methods, loss)

    def facts(data):
        runs = sorted((r["key"], r["eval_loss"], r["units"]) for r in data["runs"])
        return runs, data["decisions"], [(v["method"], v["verdict"], v["seeds"]) for v in data["verdicts"]]

    assert facts(again) == facts(whole)


def test_checkpoints_lost_with_the_coordinator_are_rebuilt_segment_by_segment(tmp_path):
    def loss(m, r, b, s):
        return plain_loss(r, b, s) + {"freeze:2": -0.15}.get(m, 0.0)

    methods = ["plain", "freeze:2"]
    whole, _ = run(tmp_path / "whole", methods, loss)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "killed", methods, None, executor=Fake(loss, stop_after=19))
    shutil.rmtree(tmp_path / "killed" / "checkpoints")
    again, executor = run(tmp_path / "killed", methods, loss)
    runs = lambda data: sorted((r["key"], r["eval_loss"]) for r in data["runs"])  # noqa: E731
    # every verdict as uninterrupted, but for its time: runs of two invocations are not timed side by side
    judged = lambda data: [  # noqa: E731
        (v["method"], v["verdict"], v["speedup_units"], v["loss_delta"], v.get("band"))
        for v in data["verdicts"]
    ]
    assert runs(again) == runs(whole) and judged(again) == judged(whole)
    times = {v["method"]: v["speedup_time"] for v in again["verdicts"]}
    assert times["freeze:2"] is None and verdict_of(whole, "freeze:2")["speedup_time"] is not None
    assert len(executor.ran) > len(again["runs"]) - 19  # recorded segments were run again


def test_a_record_keeps_the_centre_its_range_test_gave_when_it_ran(tmp_path):
    """A record resumed after the range test's rule changed keeps its races' centre: the centre kept with
    the test is used, not the current rule's reading of its losses (which would move every rate and leave
    the runs made unused)."""
    from hf_hybrid.bench.range_test import suggested_rate

    class KeptCentre(Fake):
        def wait(self):
            done = super().wait()
            if done[0].spec.kind == "range_test":
                done[0].measured.details["centre"] = 0.00123
            return done

    executor = KeptCentre(lambda m, r, b, s: plain_loss(r, b, s))
    data, _ = run(tmp_path, ["plain"], None, seeds=(0,), executor=executor, task_rate=None)
    (test,) = [r for r in data["runs"] if r["kind"] == "range_test"]
    assert suggested_rate(test["losses"], test["stop"]) != 0.00123
    assert data["decisions"]["base_learning_rate"] == 0.00123
