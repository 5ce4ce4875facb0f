"""The shared invariants can fail: each one catches a violation planted on purpose.

Sabotage goes through objects the test owns (a callback, the engine's guard of this trainer, files in
this test's checkpoint folder), never through the library.
"""

from __future__ import annotations

import logging
import math
import shutil

import pytest
import torch
from fault_invariants import CheckpointLoader, Invariants
from harness import FROZEN, Trigger, corrupt_loss, fault_model
from helpers import hybrid_trainer
from transformers import TrainerCallback

from hf_hybrid.checkpoint import HYBRID_STATE_FILE


class _Sabotage(TrainerCallback):
    def __init__(self, trainer):
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        guard = self.trainer.engine.guard
        apply = guard.apply

        def apply_and_touch_the_optimizer(deltas, *args, **kwargs):
            for moments in self.trainer.optimizer.state.values():
                moments["exp_avg"].add_(1.0)
            return apply(deltas, *args, **kwargs)

        guard.apply = apply_and_touch_the_optimizer

    def on_step_end(self, args, state, control, **kwargs):
        params = dict(self.trainer.model.named_parameters())
        if state.global_step == 5:
            with torch.no_grad():
                params[FROZEN[0]].add_(1.0)
        if state.global_step == args.max_steps:
            with torch.no_grad():
                params["transformer.h.0.mlp.c_fc.weight"].view(-1)[0] = math.nan
            control.should_save = True


def test_every_invariant_catches_a_planted_violation(tmp_path):
    loader = CheckpointLoader()
    invariants = Invariants(loader, "self-test")
    trainer = hybrid_trainer(
        tmp_path, model=fault_model(), max_steps=24, save_strategy="steps", save_steps=12
    )
    invariants.watch(trainer)
    trainer.add_callback(_Sabotage(trainer))
    trainer.train()
    with pytest.raises(AssertionError) as caught:
        invariants.verify()
    message = str(caught.value)
    assert "PREDICT step changed the optimizer state" in message
    assert f"frozen weight {FROZEN[0]} moved" in message
    assert "checkpoint-12: frozen weight" in message and "checkpoint-24: frozen weight" in message
    assert "final model: non-finite values in transformer.h.0.mlp.c_fc.weight" in message
    assert "checkpoint-24/model.safetensors: non-finite values" in message
    assert invariants.predict_steps_checked > 0

    # the new-process check: one checkpoint resumes, a copy without its tensor file does not
    broken = tmp_path / "broken" / "checkpoint-12"
    shutil.copytree(tmp_path / "checkpoint-12", broken)
    (broken / HYBRID_STATE_FILE).unlink()
    # ... and it resumes exactly where the run was: the run's own records of steps 12 and 13 are met (the
    # sabotage touched the optimizer in predict steps only), a record that differs in one digest is not
    records = invariants.records[id(trainer)]
    assert trainer.hybrid_timeline[12]["phase"] != "predict"  # step 13 (0-based 12): no sabotage in it
    good = tmp_path / "checkpoint-12"
    loader.add("good", good, list(FROZEN), loaded=records[12], after=[records[13]])
    loader.add("broken", broken, list(FROZEN))
    loader.add("moved", good, list(FROZEN), loaded={**records[12], "weights": "0" * 64})
    lost = {**records[13], "optimizer": "0" * 64}
    loader.add("lost", good, list(FROZEN), loaded=records[12], after=[lost])
    with pytest.raises(AssertionError) as caught:
        loader.run(tmp_path)
    message = str(caught.value)
    assert "broken:" in message and "hybrid_state.safetensors is missing" in message
    assert "good:" not in message
    assert "moved:" in message and "resumed from step 12 with ['weights'] other than" in message
    assert "lost:" in message and "resumed step 13: ['optimizer'] differ from the" in message


def test_the_action_invariant_catches_a_log_that_disagrees(tmp_path):
    """A spike in a predict step is rolled back; an engine that logs another action is caught."""
    invariants = Invariants(CheckpointLoader(), "self-test-actions")
    trainer = hybrid_trainer(tmp_path, model=fault_model(), max_steps=30, hybrid_warmup_steps=14)
    invariants.watch(trainer)
    trigger = Trigger(trainer, "predict", mid_phase=True)
    corrupt_loss(trainer, trigger, lambda loss: loss * 100.0)

    class _Lie(TrainerCallback):
        """After every rollback, the engine also logs that it forced FULL steps instead."""

        def on_train_begin(self, args, state, control, **kwargs):
            engine = trainer.engine
            recover = engine._recover

            def recover_and_misreport(alarms, step_phase):
                action = recover(alarms, step_phase)
                if action.value == "rollback":
                    step = engine.controller.steps_decided
                    extra = {"hybrid_action": "force_full", "hybrid_step": step}
                    logging.getLogger("hf_hybrid.engine.engine").info("forced FULL", extra=extra)
                return action

            engine._recover = recover_and_misreport

    trainer.add_callback(_Lie())
    trainer.train()
    assert trigger.steps and trainer.hybrid_timeline[trigger.steps[0]]["action"] == "rollback"
    assert invariants.actions_checked["rollback"] >= 1
    with pytest.raises(AssertionError, match=r"logged actions .*'force_full'.* != performed"):
        invariants.verify()
