"""The engine sleeps on a sample of the coordinates until its skill nears the threshold, then wakes to
full-size buffers; a run resumed from before the wake-up continues exactly."""

from __future__ import annotations

import pytest
import torch
from helpers import counters, hybrid_trainer
from transformers import TrainerCallback

from hf_hybrid.engine.engine import HybridEngine

SLEEPY = {
    "max_steps": 40,
    "hybrid_confidence_threshold": 0.3,
    "hybrid_warmup_steps": 10,
    "hybrid_dormant_every": 8,
    "save_strategy": "steps",
    "save_steps": 8,
}


class _Watch(TrainerCallback):
    def __init__(self, trainer):
        self.trainer = trainer
        self.rows = []

    def on_step_end(self, args, state, control, **kwargs):
        engine = self.trainer.engine
        # the spike guard's copies (on by default) are its own, stated cost, not the sleeping engine's
        total = engine.nbytes()
        bytes_ = total - engine.spike_guard.nbytes()
        self.rows.append({"step": state.global_step, "awake": engine.awake, "bytes": bytes_, "total": total})


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    out = tmp_path_factory.mktemp("sleepy")
    trainer = hybrid_trainer(out, **SLEEPY)
    watch = _Watch(trainer)
    trainer.add_callback(watch)
    trainer.train()
    return out, trainer, watch.rows


def test_asleep_it_holds_a_sample_awake_the_full_buffers(straight):
    _, trainer, rows = straight
    trainable = sum(p.numel() * p.element_size() for p in trainer.engine.params.values())
    asleep = [r for r in rows if not r["awake"]]
    awake = [r for r in rows if r["awake"]]
    assert asleep and awake and asleep[0]["step"] == 1  # it starts asleep and wakes later
    assert max(r["bytes"] for r in asleep) < 0.01 * trainable  # sampled buffers only, no forecaster
    assert min(r["bytes"] for r in awake) >= trainable  # the full-size copy of the parameters at least
    assert trainer.hybrid_stats()["steps_per_phase"]["predict"] > 0
    stats = trainer.hybrid_stats()
    assert stats["engine_peak_bytes"] >= max(r["total"] for r in rows)
    assert stats["engine_peak_host_bytes"] == stats["engine_peak_bytes"]  # all on the CPU here


def test_resume_across_the_wake_up_is_exact(straight, tmp_path):
    out, trainer, rows = straight
    first_awake = next(r["step"] for r in rows if r["awake"])
    before = max(step for step in range(8, 41, 8) if step < first_awake)
    resumed = hybrid_trainer(tmp_path, **SLEEPY)  # saving where the straight run saved (a save rebases
    resumed.train(resume_from_checkpoint=str(out / f"checkpoint-{before}"))  # the spike guard's copies)
    assert not torch.load(
        out / f"checkpoint-{before}" / "training_args.bin", weights_only=False
    ).hybrid_restart_engine
    assert resumed.engine.awake
    assert [r["phase"] for r in resumed.hybrid_timeline] == [r["phase"] for r in trainer.hybrid_timeline]
    for name, value in resumed.model.named_parameters():
        assert torch.equal(value, dict(trainer.model.named_parameters())[name]), name
    assert counters(resumed.hybrid_stats()) == counters(trainer.hybrid_stats())


class _AwakeAtBegin(TrainerCallback):
    def __init__(self, trainer):
        self.trainer = trainer
        self.awake = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.awake = self.trainer.engine.awake  # the engine as restored, before any step


def test_resume_from_an_awake_checkpoint_into_a_config_where_it_may_sleep_is_exact(straight, tmp_path):
    """A new engine of this configuration starts asleep; restoring a state saved awake must wake it first
    (full-size buffers), then load them: the run continues exactly."""
    out, trainer, rows = straight
    awake_at = {r["step"] for r in rows if r["awake"]}
    after = min(step for step in range(8, 40, 8) if step in awake_at)  # a checkpoint saved awake
    resumed = hybrid_trainer(tmp_path, **SLEEPY)  # saving where the straight run saved
    fresh = HybridEngine(dict(trainer.engine.params), resumed.engine_config)
    assert fresh.watch.can_sleep and not fresh.awake  # so the restore has to switch it
    at_begin = _AwakeAtBegin(resumed)
    resumed.add_callback(at_begin)
    resumed.train(resume_from_checkpoint=str(out / f"checkpoint-{after}"))
    assert at_begin.awake is True
    assert [r["phase"] for r in resumed.hybrid_timeline] == [r["phase"] for r in trainer.hybrid_timeline]
    assert resumed.hybrid_timeline[after:] and "predict" in [
        r["phase"] for r in resumed.hybrid_timeline[after:]
    ]
    expected = dict(trainer.model.named_parameters())
    for name, value in resumed.model.named_parameters():
        assert torch.equal(value, expected[name]), name
    assert counters(resumed.hybrid_stats()) == counters(trainer.hybrid_stats())
