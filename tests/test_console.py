"""What a user sees on the console: the plain Trainer's log lines with one compact hybrid entry, and a
summary at the end that says what happened and, when nothing was predicted, why."""

from __future__ import annotations

import pytest
from helpers import hybrid_trainer


@pytest.mark.parametrize("disable_tqdm", [True, False], ids=["printer", "tqdm"])
def test_the_console_shows_a_compact_entry_and_a_summary(tmp_path, capsys, disable_tqdm):
    trainer = hybrid_trainer(
        tmp_path, max_steps=30, logging_steps=10, disable_tqdm=disable_tqdm, hybrid_confidence_threshold=0.99
    )
    trainer.train()
    captured = capsys.readouterr()
    console = captured.out + captured.err
    assert "'hybrid': 'warmup, 0% backward skipped'" in console
    assert "'hybrid': 'full, 0% backward skipped'" in console
    assert "hybrid/" not in console  # the full keys went to the log history, not the console
    assert "hybrid/phase" in trainer.state.log_history[0]
    summary = next(line for line in console.splitlines() if line.startswith("hf_hybrid: 30 steps"))
    assert "(10 warmup, 20 full)" in summary and "0 backward passes skipped" in summary
    assert "No predict phase opened: the highest measured confidence was" in summary
    assert "under the threshold 0.99 (`hybrid_confidence_threshold`)" in summary


def test_full_console_metrics_print_every_key(tmp_path, capsys):
    trainer = hybrid_trainer(
        tmp_path, max_steps=12, logging_steps=6, disable_tqdm=True, hybrid_console_metrics="full"
    )
    trainer.train()
    console = capsys.readouterr().out
    assert "'hybrid/phase'" in console and "'hybrid/backward_skipped_fraction'" in console
    assert "'hybrid':" not in console
    assert "'hybrid/phase': 'warmup'" in console and "'hybrid/phase': 'full'" in console  # by name
    logged = [entry["hybrid/phase"] for entry in trainer.state.log_history if "hybrid/phase" in entry]
    assert logged == [0.0, 1.0]  # the trackers keep the code


def test_a_run_that_never_predicts_logs_no_warning_even_on_a_loss_spike(tmp_path, caplog):
    """A spike at a FULL step makes the engine wait FULL steps before any predict phase: nothing a user
    must act on, so it is an INFO line that names the action, not a WARNING."""
    trainer = hybrid_trainer(tmp_path, max_steps=40, hybrid_confidence_threshold=0.99)
    fired = []

    def spike(module, inputs, output):
        if trainer.state.global_step == 30 and not fired:
            fired.append(True)
            output.loss = output.loss * 5.0
        return output

    trainer.model.register_forward_hook(spike)
    with caplog.at_level("INFO", logger="hf_hybrid"):
        trainer.train()
    assert fired and trainer.hybrid_stats()["predict_phases"] == 0
    reason = trainer.hybrid_stats()["no_predict_reason"]
    assert reason.startswith("No predict phase opened: the highest measured confidence was ")
    assert "under the threshold 0.99" in reason
    ours = [r for r in caplog.records if r.name.startswith("hf_hybrid")]
    assert [r.getMessage() for r in ours if r.levelname == "WARNING"] == []
    actions = [r for r in caplog.records if getattr(r, "hybrid_action", None)]
    assert actions and all(r.levelname == "INFO" for r in actions)
    assert any("FULL steps before the next predict phase" in r.getMessage() for r in actions)


def test_a_run_mostly_in_warmup_says_so_instead_of_blaming_the_threshold(tmp_path):
    """Issue 24, item 1: with 20 of 30 steps in warmup, the reason names the warmup, not the threshold."""
    trainer = hybrid_trainer(tmp_path, max_steps=30, hybrid_warmup_steps=20, hybrid_confidence_threshold=0.99)
    trainer.train()
    reason = trainer.hybrid_stats()["no_predict_reason"]
    assert reason.startswith("No predict phase opened: 20 of the run's 30 steps were warmup")
    assert "Lower `hybrid_warmup_steps` or train longer" in reason
    every = hybrid_trainer(tmp_path / "all", max_steps=10, hybrid_warmup_steps=20)
    every.train()
    assert (
        "ended inside the warmup (`hybrid_warmup_steps`; all 10 steps)"
        in every.hybrid_stats()["no_predict_reason"]
    )


def test_hybrid_stats_has_the_same_keys_with_the_engine_off(tmp_path):
    """Issue 24, item 6: `hybrid_enabled=False` returned fewer keys (a script reading `rollbacks` got a
    KeyError); now the same keys, zeros where nothing happened."""
    on = hybrid_trainer(tmp_path / "on", max_steps=4, hybrid_warmup_steps=10)
    off = hybrid_trainer(tmp_path / "off", max_steps=4, hybrid_enabled=False)
    on.train()
    off.train()
    stats_on, stats_off = on.hybrid_stats(), off.hybrid_stats()
    assert set(stats_off) == set(stats_on) and set(stats_off["timing"]) == set(stats_on["timing"])
    assert (
        stats_off["enabled"] is False and stats_off["rollbacks"] == 0 and stats_off["backward_skipped"] == 0
    )
    assert stats_off["steps_per_phase"] == {phase: 0 for phase in stats_on["steps_per_phase"]}
