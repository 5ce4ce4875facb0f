"""The hybrid state travels with HF checkpoints; a resumed run continues exactly."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import hybrid_trainer, step_logs
from transformers import TrainerCallback

from hf_hybrid.checkpoint import HYBRID_STATE_FILE, HybridCheckpointError


class SaveAt(TrainerCallback):
    """Save a checkpoint right after the first step of each wanted kind."""

    def __init__(self, trainer, wanted=("mid_predict", "correct")):
        self.trainer = trainer
        self.pending = set(wanted)
        self.saved: dict[str, int] = {}

    def on_step_end(self, args, state, control, **kwargs):
        engine = self.trainer.engine
        phase = self.trainer.hybrid_timeline[-1]["phase"]
        kind = None
        if phase == "predict" and engine.controller.predict_remaining > 0:
            kind = "mid_predict"
        elif phase == "correct":
            kind = "correct"
        if kind in self.pending:
            self.pending.discard(kind)
            self.saved[kind] = state.global_step
            control.should_save = True


def _params(trainer):
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("straight")
    trainer = hybrid_trainer(out, max_steps=40, save_strategy="steps", save_steps=10_000)
    saver = SaveAt(trainer)
    trainer.add_callback(saver)
    trainer.train()
    assert set(saver.saved) == {"mid_predict", "correct"}
    return out, trainer, saver.saved


@pytest.mark.parametrize("kind", ["mid_predict", "correct"])
def test_resume_continues_exactly(straight_run, tmp_path, kind):
    out, straight, saved = straight_run
    step = saved[kind]
    resumed = hybrid_trainer(out, max_steps=40, save_strategy="no")
    resumed.train(resume_from_checkpoint=str(out / f"checkpoint-{step}"))
    assert [r["phase"] for r in resumed.hybrid_timeline] == [r["phase"] for r in straight.hybrid_timeline]
    assert step_logs(resumed, "loss")[-(40 - step) :] == step_logs(straight, "loss")[-(40 - step) :]
    expected = _params(straight)
    for name, value in _params(resumed).items():
        assert torch.equal(value, expected[name]), name
    assert resumed.hybrid_stats() == straight.hybrid_stats()


def test_trainer_state_json_holds_readable_hybrid_state(straight_run):
    out, _, saved = straight_run
    folder = out / f"checkpoint-{saved['mid_predict']}"
    state = json.loads((folder / "trainer_state.json").read_text())
    entry = state["stateful_callbacks"]["HybridStateCallback"]["attributes"]["engine_state"]
    assert entry["format_version"] == 1
    assert entry["state"]["controller"]["phase"] == "predict"
    assert entry["state"]["controller"]["predict_remaining"] > 0
    assert entry["state"]["config"]["predictor"] == "ema"
    assert entry["state"]["snapshot"]  # a phase is open, so its rollback point is saved
    assert (folder / HYBRID_STATE_FILE).is_file()


def test_a_corrupt_tensor_file_is_refused_with_a_clear_message(straight_run, tmp_path):
    out, _, saved = straight_run
    import shutil

    folder = tmp_path / "checkpoint-x"
    shutil.copytree(out / f"checkpoint-{saved['correct']}", folder)
    data = (folder / HYBRID_STATE_FILE).read_bytes()
    (folder / HYBRID_STATE_FILE).write_bytes(data[: len(data) // 2])
    trainer = hybrid_trainer(tmp_path / "run", max_steps=40)
    with pytest.raises(HybridCheckpointError, match="corrupt or truncated.*hybrid_restart_engine=True"):
        trainer.train(resume_from_checkpoint=str(folder))


def test_a_changed_predictor_is_refused_and_restart_engine_accepts_it(straight_run, tmp_path):
    out, _, saved = straight_run
    folder = str(out / f"checkpoint-{saved['correct']}")
    trainer = hybrid_trainer(tmp_path / "a", max_steps=40, hybrid_predictor="lowrank")
    with pytest.raises(HybridCheckpointError, match=r"configuration differs.*'predictor': \('ema', 'lowrank'\)"):
        trainer.train(resume_from_checkpoint=folder)
    trainer = hybrid_trainer(tmp_path / "b", max_steps=40, hybrid_predictor="lowrank", hybrid_restart_engine=True)
    trainer.train(resume_from_checkpoint=folder)
    assert trainer.state.global_step == 40
