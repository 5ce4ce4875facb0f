"""FULL-phase fidelity: where no prediction happens, HybridHFTrainer is the plain Trainer, bit for bit."""

from __future__ import annotations

import pytest
import torch
from helpers import hybrid_trainer, plain_trainer, step_logs
from transformers import TrainingArguments

from hf_hybrid import HybridHFTrainer, HybridTrainingArguments


def _assert_same_run(plain, hybrid) -> None:
    assert step_logs(plain, "loss") == step_logs(hybrid, "loss")
    assert step_logs(plain, "grad_norm") == step_logs(hybrid, "grad_norm")
    assert len(step_logs(plain, "loss")) == plain.args.max_steps
    plain_params = dict(plain.model.named_parameters())
    for name, p in hybrid.model.named_parameters():
        assert torch.equal(p, plain_params[name]), name


@pytest.mark.parametrize("accumulation", [1, 4])
def test_disabled_is_the_plain_trainer(tmp_path, accumulation):
    plain = plain_trainer(tmp_path / "plain", max_steps=12, gradient_accumulation_steps=accumulation)
    plain.train()
    hybrid = hybrid_trainer(
        tmp_path / "hybrid", max_steps=12, gradient_accumulation_steps=accumulation, hybrid_enabled=False
    )
    hybrid.train()
    assert hybrid.engine is None
    _assert_same_run(plain, hybrid)


@pytest.mark.parametrize("accumulation", [1, 4])
def test_warmup_and_full_steps_are_bit_identical(tmp_path, accumulation):
    """An enabled engine that only observes (warmup + full, threshold 1.0) changes nothing."""
    plain = plain_trainer(tmp_path / "plain", max_steps=16, gradient_accumulation_steps=accumulation)
    plain.train()
    hybrid = hybrid_trainer(
        tmp_path / "hybrid",
        max_steps=16,
        gradient_accumulation_steps=accumulation,
        hybrid_warmup_steps=6,
        hybrid_confidence_threshold=1.0,
    )
    hybrid.train()
    phases = hybrid.hybrid_stats()["steps_per_phase"]
    assert phases == {"warmup": 6, "full": 10, "predict": 0, "correct": 0}
    _assert_same_run(plain, hybrid)


def test_steps_before_the_first_predict_phase_match_the_plain_trainer(tmp_path):
    plain = plain_trainer(tmp_path / "plain", max_steps=30)
    plain.train()
    hybrid = hybrid_trainer(tmp_path / "hybrid", max_steps=30)
    hybrid.train()
    phases = [row["phase"] for row in hybrid.hybrid_timeline]
    first_predict = phases.index("predict")
    assert first_predict >= 10
    # The loss logged at a step is measured before that step's update, so it matches up to and including
    # the first predicted step; weights differ from then on.
    assert step_logs(plain, "loss")[: first_predict + 1] == step_logs(hybrid, "loss")[: first_predict + 1]
    assert step_logs(plain, "loss")[first_predict + 1 :] != step_logs(hybrid, "loss")[first_predict + 1 :]


def test_plain_training_arguments_are_upcast_with_hybrid_defaults(tmp_path):
    from helpers import tiny_data, tiny_gpt2

    train, _ = tiny_data()
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True, learning_rate=1e-4)
    trainer = HybridHFTrainer(model=tiny_gpt2(), args=args, train_dataset=train)
    assert isinstance(trainer.args, HybridTrainingArguments)
    assert trainer.args.learning_rate == 1e-4
    assert trainer.args.hybrid_enabled is True
    assert trainer.args.hybrid_warmup_steps == HybridTrainingArguments.hybrid_warmup_steps


@pytest.mark.parametrize("adapters", [False, True], ids=["full", "lora"])
def test_the_true_defaults_are_the_plain_trainer_past_the_warmup(tmp_path, adapters):
    """No `hybrid_*` setting at all (the README's "the run is the plain Trainer's, bit for bit"): 160
    steps, so the default 100-step warmup ends and the engine runs its FULL steps, scoring its predictors
    with the default threshold; every loss, gradient norm and weight is the plain Trainer's."""
    from helpers import common_args, lora_gpt2, tiny_data, tiny_gpt2

    steps = 160
    train, _ = tiny_data()
    plain = plain_trainer(tmp_path / "plain", model=lora_gpt2() if adapters else tiny_gpt2(), max_steps=steps)
    plain.train()
    args = HybridTrainingArguments(**common_args(tmp_path / "hybrid", max_steps=steps))
    hybrid = HybridHFTrainer(model=lora_gpt2() if adapters else tiny_gpt2(), args=args, train_dataset=train)
    hybrid.train()
    stats = hybrid.hybrid_stats()
    warmup = HybridTrainingArguments.hybrid_warmup_steps
    assert warmup < steps  # the warmup ended: the engine ran awake for the rest of the run
    assert stats["steps_per_phase"] == {"warmup": warmup, "full": steps - warmup, "predict": 0, "correct": 0}
    assert stats["backward_skipped"] == 0 and stats["rollbacks"] == 0 and stats["restores"] == 0
    _assert_same_run(plain, hybrid)
