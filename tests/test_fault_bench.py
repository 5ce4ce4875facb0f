"""`hf-hybrid bench --faults`: every arm clean and faulted, resumable, a table; the faults as injected."""

from __future__ import annotations

import json

import pytest
import torch

from hf_hybrid.bench.measure.faults import FaultWindow, best_point_table, corrupt, fault_table, fault_window
from hf_hybrid.cli import main


def test_the_fault_bench_runs_every_arm_clean_and_faulted_and_resumes(tmp_path, capsys):
    argv = ["bench", "--faults", "garbage", "--suite", "tiny", "--seeds", "0", "--max_steps", "30"]
    argv += ["--out", str(tmp_path)]
    assert main(argv) == 0
    record = json.loads((tmp_path / "clm_stdlib" / "faults.json").read_text())
    runs = {(r["arm"], r["fault"]) for r in record["runs"]}
    assert runs == {
        (arm, fault) for arm in ("plain", "hybrid:spike_guard=on") for fault in ("clean", "garbage")
    }
    guarded = [r for r in record["runs"] if r["arm"] == "hybrid:spike_guard=on"]
    assert all(r["spike_guard_bytes"] > 0 and "restores" in r for r in guarded)
    assert all(r["spike_guard_bytes"] == 0 for r in record["runs"] if r["arm"] == "plain")
    table = (tmp_path / "clm_stdlib" / "faults.md").read_text()
    assert table == fault_table(record) + "\n" and "| garbage | `plain` |" in table
    capsys.readouterr()
    assert main(argv) == 0  # everything is in the record: nothing runs again
    assert "eval loss" not in capsys.readouterr().out.split("| fault |")[0]
    assert len(json.loads((tmp_path / "clm_stdlib" / "faults.json").read_text())["runs"]) == 4


def test_an_unknown_fault_is_refused_naming_the_known_ones(tmp_path, capsys):
    argv = ["bench", "--faults", "meteor", "--suite", "tiny", "--seeds", "0", "--out", str(tmp_path)]
    assert main(argv) == 2
    assert (
        "unknown fault 'meteor'; faults: ['lr_burst', 'garbage', 'shuffled_labels'], "
        "controls: ['skip_clean_2', 'skip_clean_5', 'replay_clean_2', 'replay_clean_5']"
        in capsys.readouterr().err
    )


def test_the_fault_window_is_mid_run_and_the_corruptions_change_what_they_say():
    assert fault_window("lr_burst", 100) == FaultWindow("lr_burst", 50, 3)
    window = fault_window("shuffled_labels", 40)
    assert [window.covers(s) for s in (19, 20, 24, 25)] == [False, True, True, False]
    ids = torch.arange(12).reshape(4, 3)
    batch = {"input_ids": ids, "labels": torch.tensor([0, 1, 2, 3])}
    shuffled = corrupt(batch, "shuffled_labels", torch.Generator().manual_seed(0), vocab=50)
    assert torch.equal(shuffled["input_ids"], ids) and torch.equal(
        batch["labels"], torch.tensor([0, 1, 2, 3])
    )
    assert sorted(shuffled["labels"].tolist()) == [0, 1, 2, 3]
    assert all(a != b for a, b in zip(shuffled["labels"].tolist(), [0, 1, 2, 3], strict=True))
    lm = {"input_ids": ids, "labels": ids.clone()}
    garbage = corrupt(lm, "garbage", torch.Generator().manual_seed(0), vocab=50)
    assert not torch.equal(garbage["input_ids"], ids) and torch.equal(garbage["labels"], garbage["input_ids"])
    with pytest.raises(ValueError, match="unknown fault"):
        fault_window("meteor", 10)


def test_a_fault_is_also_read_where_the_clean_plain_run_is_best():
    """A task that overfits: the clean plain run is best at step 150, so every fault is read there too
    (by hand: the faulted plain run is 0.05 above its clean run at 150, the guarded one 0.01)."""

    def run(arm: str, fault: str, curve: list[list[float]]) -> dict:
        return {"arm": arm, "fault": fault, "seed": 0, "curve": curve}

    record = {
        "runs": [
            run("plain", "clean", [[100, 1.10], [150, 1.00], [200, 1.04]]),
            run("plain", "lr_burst", [[100, 1.30], [150, 1.05], [200, 1.02]]),
            run("guard", "clean", [[100, 1.10], [150, 1.00], [200, 1.04]]),
            run("guard", "lr_burst", [[100, 1.12], [150, 1.01], [200, 1.045]]),
        ]
    }
    rows = best_point_table(record).splitlines()[2:]
    assert rows == [
        "| lr_burst | `plain` | 0 | 150 | 1.0500 | +0.0500 |",
        "| lr_burst | `guard` | 0 | 150 | 1.0100 | +0.0100 |",
    ]


def test_fault_eval_points_are_checked_before_any_run(tmp_path, capsys):
    argv = ["bench", "--faults", "garbage", "--suite", "tiny", "--seeds", "0", "--out", str(tmp_path)]
    assert main([*argv, "--fault_eval_points", "0"]) == 2
    assert "--fault_eval_points must be an integer >= 1, not 0" in capsys.readouterr().err
    (tmp_path / "clm_stdlib").mkdir()
    (tmp_path / "clm_stdlib" / "faults.json").write_text(
        json.dumps({"task": {}, "runs": [], "eval_points": 1})
    )
    assert main([*argv, "--fault_eval_points", "4"]) == 2
    assert "was made with eval_points 1, not 4" in capsys.readouterr().err


def test_a_skip_control_leaves_weights_and_optimizer_state_alone_in_its_window_only(tmp_path):
    """`skip_clean_2` on the plain `Trainer` (20 steps: the window is steps 11 and 12): the clean batches
    run forward and backward, but no update reaches the weights or Adam's state there; the schedule moves
    on, and every step outside the window trains."""
    from helpers import plain_trainer
    from transformers import TrainerCallback

    from hf_hybrid.bench.measure.faults import inject

    class States(TrainerCallback):
        def __init__(self) -> None:
            self.at: dict[int, tuple[list[torch.Tensor], list[torch.Tensor], float]] = {}

        def on_step_end(self, args, state, control, model=None, optimizer=None, **kwargs):
            moments = [t.clone() for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
            weights = [p.detach().clone() for p in model.parameters()]
            self.at[state.global_step] = (weights, moments, optimizer.param_groups[0]["lr"])

    trainer = plain_trainer(tmp_path, max_steps=20)
    states = States()
    trainer.add_callback(states)
    inject(trainer, fault_window("skip_clean_2", 20), seed=0)
    trainer.train()

    def same(a: int, b: int) -> bool:
        return all(
            torch.equal(x, y)
            for part in (0, 1)
            for x, y in zip(states.at[a][part], states.at[b][part], strict=True)
        )

    assert same(10, 11) and same(11, 12)
    assert not same(9, 10) and not same(12, 13)
    assert states.at[12][2] != states.at[10][2]  # the schedule went on


def test_a_replay_control_trains_its_window_on_the_batches_just_before_it(tmp_path):
    """`replay_clean_2` (20 steps: the window is steps 10 and 11, 0-based) trains them on the batches of
    steps 8 and 9 again, and every other step on its own batch."""
    from helpers import plain_trainer

    from hf_hybrid.bench.measure.faults import inject

    trainer = plain_trainer(tmp_path, max_steps=20)
    inject(trainer, fault_window("replay_clean_2", 20), seed=0)
    seen: dict[int, torch.Tensor] = {}
    compute = trainer.compute_loss

    def compute_loss(model, inputs, *args, **kwargs):
        seen[trainer.state.global_step] = inputs["input_ids"].clone()
        return compute(model, inputs, *args, **kwargs)

    trainer.compute_loss = compute_loss
    trainer.train()
    assert torch.equal(seen[10], seen[8]) and torch.equal(seen[11], seen[9])
    assert not torch.equal(seen[9], seen[8]) and not torch.equal(seen[12], seen[10])
