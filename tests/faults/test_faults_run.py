"""Faults around a run: SIGKILL at a random step, unusable datasets, a run shorter than the warmup,
a model with nothing to train.

| fault                        | expected outcome                                                  |
|------------------------------|-------------------------------------------------------------------|
| SIGKILL mid-step (a random   | resume from the last complete checkpoint; the run ends            |
| PREDICT or CORRECT step)     | bit-identical to one never killed                                 |
| empty train_dataset          | ValueError naming `train_dataset`, before any step (plain: torch's|
|                              | sampler says `num_samples=0`)                                     |
| batches without the model's  | the plain Trainer's own ValueError, word for word, before any     |
| keys (4 kinds)               | optimizer step                                                    |
| max_steps <= warmup          | one warning naming both settings; losses and weights bit-identical|
|                              | to the plain Trainer                                              |
| no trainable parameter       | ValueError naming the cause, before any forward (plain: a         |
|                              | RuntimeError in the first backward)                               |

SIGKILL *during a save*, and corrupt/missing/foreign checkpoints, are in tests/test_checkpoint.py.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from harness import fault_model
from helpers import common_args, counters, hybrid_trainer, plain_trainer, step_logs, tiny_data, tiny_gpt2
from transformers import Trainer, TrainingArguments

from hf_hybrid import HybridHFTrainer, HybridTrainingArguments
from hf_hybrid.checkpoint import last_complete_checkpoint

SCRIPT = Path(__file__).parents[1] / "programs" / "hybrid_run.py"


def _params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("phase", ["predict", "correct"])
def test_sigkill_at_a_random_step_then_resume(tmp_path, invariants, phase):
    # saved where the killed run saves: a save rebases the spike guard's copies
    every_10 = {"save_strategy": "steps", "save_steps": 10}
    straight = invariants.watch(hybrid_trainer(tmp_path / "straight", max_steps=40, **every_10))
    straight.train()
    candidates = [i for i, row in enumerate(straight.hybrid_timeline) if row["phase"] == phase and i > 10]
    kill_at = random.Random(f"sigkill-{phase}").choice(candidates)
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), "--max-steps", "40", "--save-every", "10"]
        + ["--kill-at-step", str(kill_at), "--result", str(tmp_path / "result.json")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert not (tmp_path / "result.json").exists()
    assert last_complete_checkpoint(out) == str(out / f"checkpoint-{kill_at // 10 * 10}")
    resumed = invariants.watch(hybrid_trainer(out, max_steps=40, **every_10), reference=straight)
    resumed.train(resume_from_checkpoint=True)
    invariants.verify()
    assert [r["phase"] for r in resumed.hybrid_timeline] == [r["phase"] for r in straight.hybrid_timeline]
    assert counters(resumed.hybrid_stats()) == counters(straight.hybrid_stats())
    expected = _params(straight.model)
    for name, value in _params(resumed.model).items():
        assert torch.equal(value, expected[name]), name


def _forwards(model):
    calls = []
    model.register_forward_hook(lambda *a: calls.append(1))
    return calls


def test_an_empty_dataset_is_refused_naming_it(tmp_path, invariants):
    empty = Dataset.from_dict({"input_ids": [], "labels": []})
    plain = Trainer(
        model=tiny_gpt2(), args=TrainingArguments(**common_args(tmp_path / "p")), train_dataset=empty
    )
    with pytest.raises(ValueError) as plain_error:
        plain.train()
    assert "train_dataset" not in str(plain_error.value)  # torch's sampler: "num_samples=0"
    trainer = HybridHFTrainer(
        model=fault_model(), args=HybridTrainingArguments(**common_args(tmp_path / "h")), train_dataset=empty
    )
    invariants.watch(trainer)
    forwards = _forwards(trainer.model)
    with pytest.raises(ValueError, match=r"`train_dataset` is empty \(0 examples\)"):
        trainer.train()
    invariants.verify()
    assert forwards == [] and trainer.state.global_step == 0


class _WrongKeys(torch.utils.data.Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        return {"tokens": torch.ones(32, dtype=torch.long)}


_DATASETS = {
    "text_only": lambda: Dataset.from_dict({"text": ["def f():\n    return 1\n"] * 16}),
    "labels_only": lambda: Dataset.from_dict({"labels": [[1] * 32] * 16}),
    "no_labels": lambda: Dataset.from_dict({"input_ids": [[1] * 32] * 16}),
    "torch_wrong_keys": _WrongKeys,
}


@pytest.mark.parametrize("kind", sorted(_DATASETS))
def test_batches_without_the_model_keys_fail_like_the_plain_trainer(tmp_path, invariants, kind):
    plain = Trainer(
        model=tiny_gpt2(),
        args=TrainingArguments(**common_args(tmp_path / "p")),
        train_dataset=_DATASETS[kind](),
    )
    with pytest.raises(Exception) as plain_error:
        plain.train()
    trainer = HybridHFTrainer(
        model=fault_model(),
        args=HybridTrainingArguments(**common_args(tmp_path / "h")),
        train_dataset=_DATASETS[kind](),
    )
    invariants.watch(trainer)
    start = _params(trainer.model)
    with pytest.raises(type(plain_error.value)) as error:
        trainer.train()
    invariants.verify()
    assert str(error.value) == str(plain_error.value)
    assert isinstance(error.value, ValueError)
    assert trainer.state.global_step == 0 and trainer.hybrid_stats().get("backward_run", 0) == 0
    assert all(torch.equal(p, start[n]) for n, p in _params(trainer.model).items())


def test_max_steps_inside_the_warmup_warns_once_and_trains_like_the_plain_trainer(
    tmp_path, invariants, caplog
):
    plain = plain_trainer(tmp_path / "p", model=fault_model(), max_steps=8)
    plain.train()
    trainer = invariants.watch(hybrid_trainer(tmp_path / "h", model=fault_model(), max_steps=8))
    with caplog.at_level("WARNING", logger="hf_hybrid"):
        trainer.train()
    invariants.verify()
    warnings = [r.getMessage() for r in caplog.records if "ends inside the hybrid warmup" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "max_steps=8" in warnings[0] and "hybrid_warmup_steps=10" in warnings[0]
    assert step_logs(trainer, "loss") == step_logs(plain, "loss")
    expected = _params(plain.model)
    assert all(torch.equal(p, expected[n]) for n, p in _params(trainer.model).items())
    assert trainer.hybrid_stats()["steps_per_phase"] == {"warmup": 8, "full": 0, "predict": 0, "correct": 0}


def test_a_run_that_leaves_the_warmup_does_not_warn(tmp_path, caplog):
    trainer = hybrid_trainer(tmp_path, max_steps=12)
    with caplog.at_level("WARNING", logger="hf_hybrid"):
        trainer.train()
    assert "ends inside the hybrid warmup" not in caplog.text


def test_a_model_with_no_trainable_parameter_is_refused_before_compute(tmp_path, invariants):
    model = fault_model()
    for p in model.parameters():
        p.requires_grad_(False)
    train, _ = tiny_data()
    plain_model = tiny_gpt2()
    for p in plain_model.parameters():
        p.requires_grad_(False)
    plain = Trainer(
        model=plain_model, args=TrainingArguments(**common_args(tmp_path / "p")), train_dataset=train
    )
    with pytest.raises(RuntimeError, match="does not require grad"):  # the plain Trainer: after a forward
        plain.train()
    trainer = HybridHFTrainer(
        model=model, args=HybridTrainingArguments(**common_args(tmp_path / "h")), train_dataset=train
    )
    invariants.watch(trainer)
    forwards = _forwards(trainer.model)
    with pytest.raises(ValueError, match=r"no trainable parameter \(all have requires_grad=False\)"):
        trainer.train()
    invariants.verify()
    assert forwards == [] and trainer.state.global_step == 0
    assert json.dumps(trainer.hybrid_stats()["steps_per_phase"]) == json.dumps(
        {"warmup": 0, "full": 0, "predict": 0, "correct": 0}
    )
