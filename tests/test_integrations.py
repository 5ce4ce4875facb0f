"""Trainer features users already rely on keep working with predict phases present.

Gradient accumulation, gradient checkpointing, gradient clipping, every learning-rate scheduler,
`torch_compile`, and the DeepSpeed fallback. Every run asserts that predict phases happened.
"""

from __future__ import annotations

import logging

import pytest
import torch
from helpers import counters, hybrid_args, hybrid_trainer, plain_trainer, step_logs, tiny_data, tiny_gpt2
from transformers import SchedulerType, TrainerCallback

from hf_hybrid import HybridHFTrainer


def _predicted_steps(trainer) -> int:
    return trainer.hybrid_stats()["steps_per_phase"]["predict"]


def _finite(model) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


class StepProbe(TrainerCallback):
    """Per optimizer step: phase, forward and backward passes, and the gradients the optimizer sees."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.forwards = 0
        self.backwards = 0
        self.steps: list[dict] = []
        model = trainer.model
        model.register_forward_hook(lambda *args: self._count("forwards"))
        model.transformer.ln_f.weight.register_hook(lambda grad: self._count("backwards"))

    def _count(self, kind):
        setattr(self, kind, getattr(self, kind) + 1)

    def on_step_begin(self, args, state, control, **kwargs):
        self.at_begin = (self.forwards, self.backwards)

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        grads = [p.grad for p in self.trainer.model.parameters() if p.requires_grad]
        present = [g for g in grads if g is not None]
        self.grads_present = len(present)
        self.grad_norm = (
            float(torch.linalg.vector_norm(torch.stack([g.norm() for g in present]))) if present else None
        )

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append(
            {
                "phase": self.trainer.hybrid_timeline[-1]["phase"],
                "forwards": self.forwards - self.at_begin[0],
                "backwards": self.backwards - self.at_begin[1],
                "grads_present": self.grads_present,
                "grad_norm_seen": self.grad_norm,
            }
        )


@pytest.mark.parametrize(
    "feature",
    [
        {"gradient_accumulation_steps": 4},
        {"gradient_checkpointing": True},
        {"max_grad_norm": 0.0},
        {"max_grad_norm": 0.5},
    ],
    ids=["grad_accum_4", "grad_checkpointing", "max_grad_norm_0", "max_grad_norm_0.5"],
)
def test_trainer_features_with_predict_phases(tmp_path, feature):
    trainer = hybrid_trainer(tmp_path, max_steps=40, **feature)
    probe = StepProbe(trainer)
    trainer.add_callback(probe)
    trainer.train()
    assert _predicted_steps(trainer) > 0
    assert _finite(trainer.model)
    micro = feature.get("gradient_accumulation_steps", 1)
    predicted = [s for s in probe.steps if s["phase"] == "predict"]
    real = [s for s in probe.steps if s["phase"] != "predict"]
    assert len(predicted) == _predicted_steps(trainer) and len(real) + len(predicted) == 40
    # predicted steps: a forward per micro-batch (checked steps), no backward, no gradient at the optimizer
    assert all(s["forwards"] == micro and s["backwards"] == 0 and s["grads_present"] == 0 for s in predicted)
    assert all(s["forwards"] == micro and s["backwards"] == micro and s["grads_present"] > 0 for s in real)

    logs = [e for e in trainer.state.log_history if "loss" in e and "train_runtime" not in e]
    assert len(logs) == 40
    phases = [s["phase"] for s in probe.steps]
    # grad_norm is logged for real steps only (a predicted step has no gradient to measure)
    assert all(("grad_norm" in e) == (p != "predict") for e, p in zip(logs, phases, strict=True))
    # the logged loss of a predicted step is scaled like a real one's (per micro-batch mean, summed)
    for i, phase in enumerate(phases):
        if phase == "predict":
            previous_real = next(logs[j]["loss"] for j in range(i - 1, -1, -1) if phases[j] != "predict")
            assert 0.7 < logs[i]["loss"] / previous_real < 1.4, (i, logs[i]["loss"], previous_real)

    if feature.get("gradient_checkpointing"):
        assert trainer.model.is_gradient_checkpointing
    if feature.get("max_grad_norm") == 0.5:
        seen = [s["grad_norm_seen"] for s in real]
        logged = [e["grad_norm"] for e, p in zip(logs, phases, strict=True) if p != "predict"]
        assert max(logged) > 0.5  # clipping had something to do ...
        assert all(norm <= 0.5 * (1 + 1e-5) for norm in seen)  # ... and the optimizer saw clipped gradients


class _MeanLossLM(torch.nn.Module):
    """A tiny GPT-2 behind a forward that takes no loss kwargs: its loss is the micro-batch mean, not
    pre-scaled for gradient accumulation, so the Trainer divides it by the accumulation steps itself."""

    def __init__(self):
        super().__init__()
        self.lm = tiny_gpt2()

    def forward(self, input_ids, labels=None):
        return self.lm(input_ids=input_ids, labels=labels)


def test_predict_step_loss_is_scaled_for_accumulation_when_the_model_does_not(tmp_path):
    """With 4 micro-batches whose losses are plain means, a checked predict step's loss is their mean,
    exactly as a real step's is (the Trainer's division by 4), not 4 times it."""
    model = _MeanLossLM()
    trainer = hybrid_trainer(tmp_path, model=model, max_steps=24, gradient_accumulation_steps=4)
    micro: dict[int, list[float]] = {}
    model.register_forward_hook(
        lambda module, args, output: micro.setdefault(trainer.state.global_step, []).append(
            float(output.loss.detach())
        )
    )
    trainer.train()
    assert not trainer.model_accepts_loss_kwargs and trainer.compute_loss_func is None
    timeline = trainer.hybrid_timeline
    predicted = [i for i, row in enumerate(timeline) if row["phase"] == "predict"]
    assert predicted and trainer.hybrid_stats()["predict_checked"] == len(predicted)
    assert all(len(micro[i]) == 4 for i in range(len(timeline)))
    for i, row in enumerate(timeline):
        assert row["loss"] == pytest.approx(sum(micro[i]) / 4, rel=1e-6), (i, row["phase"])


_SCHEDULER_KWARGS = {
    "cosine_with_min_lr": {"min_lr_rate": 0.1},
    "cosine_warmup_with_min_lr": {"min_lr_rate": 0.1},
    "warmup_stable_decay": {"num_decay_steps": 10},
}
_METRIC_DRIVEN = {"reduce_lr_on_plateau": {"patience": 0, "threshold": 0.5}, "greedy": {"patience": 0}}


@pytest.mark.parametrize("kind", [s.value for s in SchedulerType if s.value not in _METRIC_DRIVEN])
def test_lr_schedule_advances_in_predict_steps_exactly_like_trainer(tmp_path, kind):
    schedule = {
        "lr_scheduler_type": kind,
        "warmup_steps": 5,
        "lr_scheduler_kwargs": _SCHEDULER_KWARGS.get(kind, {}),
    }
    plain = plain_trainer(tmp_path / "plain", max_steps=40, **schedule)
    plain.train()
    hybrid = hybrid_trainer(tmp_path / "hybrid", max_steps=40, **schedule)
    hybrid.train()
    assert _predicted_steps(hybrid) > 0
    assert step_logs(hybrid, "learning_rate") == step_logs(plain, "learning_rate")
    assert len(step_logs(hybrid, "learning_rate")) == 40
    assert _finite(hybrid.model)


@pytest.mark.parametrize("kind", sorted(_METRIC_DRIVEN))
def test_metric_driven_schedulers_move_only_at_evaluations(tmp_path, kind):
    trainer = hybrid_trainer(
        tmp_path,
        max_steps=40,
        lr_scheduler_type=kind,
        lr_scheduler_kwargs=_METRIC_DRIVEN[kind],
        eval_strategy="steps",
        eval_steps=8,
    )
    trainer.train()
    assert _predicted_steps(trainer) > 0
    assert _finite(trainer.model)
    changes, evaluated, last_lr = 0, False, None
    for entry in trainer.state.log_history:
        if "eval_loss" in entry:
            evaluated = True
        elif "learning_rate" in entry and "loss" in entry:
            if last_lr is not None and entry["learning_rate"] != last_lr:
                assert evaluated, f"learning rate moved without an evaluation at step {entry['step']}"
                changes += 1
            last_lr, evaluated = entry["learning_rate"], False
    assert changes >= 1


# An inductor-compiled run against the same run resumed uncompiled from its step-20 checkpoint: the same
# phases, losses within 4e-3 relative over the 20 resumed steps (measured; its fused kernels sum in another
# order, and 20 AdamW steps amplify that)
LOOSE_REL = 2e-2


def _compiled_run(tmp_path, backend, exact):
    trainer = hybrid_trainer(
        tmp_path,
        max_steps=40,
        torch_compile=True,
        torch_compile_backend=backend,
        save_strategy="steps",
        save_steps=20,
    )
    trainer.train()
    assert isinstance(trainer.model_wrapped, torch._dynamo.eval_frame.OptimizedModule)
    assert _predicted_steps(trainer) > 0
    assert _finite(trainer.model)
    names = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert set(trainer.engine.params) == names  # keyed by the unwrapped names, no `_orig_mod.` prefix
    # so its checkpoint resumes (here without compiling, to keep the test short) and the run goes on as
    # the compiled one did: the same phases, losses, weights and counters
    resumed = hybrid_trainer(tmp_path / "resumed", max_steps=40)
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-20"))
    assert resumed.state.global_step == 40
    assert [r["phase"] for r in resumed.hybrid_timeline] == [r["phase"] for r in trainer.hybrid_timeline]
    compiled_losses, resumed_losses = step_logs(trainer, "loss")[20:], step_logs(resumed, "loss")[20:]
    assert len(resumed_losses) == 20
    compiled_params = dict(trainer.model.named_parameters())
    if exact:  # dynamo's `eager` backend runs the captured graphs with the same kernels: bit for bit
        assert resumed_losses == compiled_losses
        assert all(torch.equal(p, compiled_params[n]) for n, p in resumed.model.named_parameters())
        assert counters(resumed.hybrid_stats()) == counters(trainer.hybrid_stats())
    else:  # inductor fuses kernels (another summation order): close, not equal
        assert resumed_losses == pytest.approx(compiled_losses, rel=LOOSE_REL)


def test_torch_compile_dynamo_with_predict_phases(tmp_path):
    """Dynamo capture (graph breaks, no_grad recompiles) with the cheap `eager` backend: ~10 s here."""
    _compiled_run(tmp_path, "eager", exact=True)


@pytest.mark.slow
def test_torch_compile_inductor_with_predict_phases(tmp_path):
    """The default inductor backend works on CPU, but a cold compile takes ~90 s on 2 cores: slow suite."""
    _compiled_run(tmp_path, "inductor", exact=False)


class _DeepSpeedFlagTrainer(HybridHFTrainer):
    """Raises only the flag `_start_engine` reads; DeepSpeed itself is not installed here."""

    def _start_engine(self, model, checkpoint=None):
        self.is_deepspeed_enabled = True
        try:
            super()._start_engine(model, checkpoint)
        finally:
            self.is_deepspeed_enabled = False


def test_deepspeed_falls_back_to_plain_training_with_a_warning(tmp_path, caplog):
    plain = plain_trainer(tmp_path / "plain", max_steps=30)
    plain.train()
    train, _ = tiny_data()
    trainer = _DeepSpeedFlagTrainer(
        model=tiny_gpt2(), args=hybrid_args(tmp_path / "ds", max_steps=30), train_dataset=train
    )
    with caplog.at_level(logging.WARNING, logger="hf_hybrid"):
        trainer.train()
    assert any(
        "DeepSpeed" in r.getMessage() and "predict phases are off" in r.getMessage() for r in caplog.records
    )
    assert trainer.engine is None
    assert trainer.hybrid_stats()["enabled"] is False
    assert not any(k.startswith("hybrid/") for e in trainer.state.log_history for k in e)
    assert step_logs(trainer, "loss") == step_logs(plain, "loss")
    assert step_logs(trainer, "grad_norm") == step_logs(plain, "grad_norm")
    plain_params = dict(plain.model.named_parameters())
    assert all(torch.equal(p, plain_params[n]) for n, p in trainer.model.named_parameters())
