"""Predict steps really skip the backward, apply exactly the guarded delta, and go in the documented order."""

from __future__ import annotations

import re

import pytest
import torch
from helpers import EveryStep, hybrid_trainer, tiny_gpt2
from transformers import TrainerCallback

import hf_hybrid.trainer
from hf_hybrid import HybridHFTrainer, Phase
from hf_hybrid.engine.predictor import EMAPredictor, register_predictor, unregister_predictor

FROZEN = ("transformer.wpe.weight", "transformer.ln_f.weight", "transformer.ln_f.bias")


class StepRecorder(TrainerCallback):
    """Snapshots parameters/optimizer state before each step; checks predicted steps after it."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.backward_calls = 0
        self.records: list[dict] = []
        self.applied: list[dict[str, torch.Tensor]] = []
        self.norms_at_apply: list[dict[str, float]] = []  # each parameter's norm when a delta is applied

    def on_train_begin(self, args, state, control, **kwargs):
        guard = self.trainer.engine.guard
        original = guard.apply

        def recording_apply(deltas, *args, **kwargs):
            norms = {n: float(guard.params[n].detach().float().norm()) for n in deltas}
            refused, final = original(deltas, *args, **kwargs)
            if refused is None:
                self.applied.append({k: v.clone() for k, v in final.items()})
                self.norms_at_apply.append(norms)
            return refused, final

        guard.apply = recording_apply
        for p in self.trainer.model.parameters():
            if p.requires_grad:
                p.register_hook(self._count)
                break

    def _count(self, grad):
        self.backward_calls += 1
        return grad

    def on_step_begin(self, args, state, control, **kwargs):
        optimizer = self.trainer.optimizer
        self.before = {
            "params": {n: p.detach().clone() for n, p in self.trainer.model.named_parameters()},
            "opt": {
                id(p): {k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()}
                for p, s in optimizer.state.items()
            },
            "backward": self.backward_calls,
            "applied": len(self.applied),
        }

    def on_step_end(self, args, state, control, **kwargs):
        row = self.trainer.hybrid_timeline[-1]
        after = {n: p.detach().clone() for n, p in self.trainer.model.named_parameters()}
        record = {"phase": row["phase"], "backward": self.backward_calls - self.before["backward"]}
        if row["phase"] == "predict":
            state_now = self.trainer.optimizer.state
            record["opt_unchanged"] = all(
                torch.equal(v, self.before["opt"][id(p)][k])
                if torch.is_tensor(v)
                else v == self.before["opt"][id(p)][k]
                for p, s in state_now.items()
                for k, v in s.items()
            )
            new = self.applied[self.before["applied"] :]
            delta = new[0] if new else {}
            record["exact_delta"] = all(
                torch.equal(after[n], self.before["params"][n] + delta[n])
                if n in delta
                else torch.equal(after[n], self.before["params"][n])
                for n in after
            )
            record["applied"] = bool(new)
        record["frozen_unchanged"] = all(torch.equal(after[n], self.before["params"][n]) for n in FROZEN)
        self.records.append(record)


def _frozen_model():
    model = tiny_gpt2()
    for name, p in model.named_parameters():
        if name in FROZEN:
            p.requires_grad_(False)
    return model


def test_predict_steps_skip_backward_and_apply_exactly_the_guarded_delta(tmp_path):
    trainer = hybrid_trainer(tmp_path, model=_frozen_model(), max_steps=50)
    recorder = StepRecorder(trainer)
    trainer.add_callback(recorder)
    trainer.train()
    predicted = [r for r in recorder.records if r["phase"] == "predict"]
    real = [r for r in recorder.records if r["phase"] != "predict"]
    assert len(predicted) >= 5
    assert all(r["backward"] == 0 for r in predicted)
    assert all(r["backward"] == 1 for r in real)
    assert all(r["opt_unchanged"] for r in predicted)
    assert all(r["exact_delta"] for r in predicted)
    assert sum(r["applied"] for r in predicted) >= 5
    assert all(r["frozen_unchanged"] for r in recorder.records)
    stats = trainer.hybrid_stats()
    assert stats["backward_skipped"] == len(predicted)
    assert stats["backward_run"] == len(real)


@pytest.mark.parametrize("check_every", [1, 0], ids=["checked", "blind"])
def test_the_null_predictor_applies_nothing(tmp_path, check_every):
    """The arena's null control (`null-hybrid`: the hybrid run's phases with the `null` predictor) rests
    on this: its predict steps skip the batch, run no backward and leave every weight and the optimizer
    state exactly as they were."""
    trainer = hybrid_trainer(tmp_path, max_steps=50, hybrid_predictor="null", hybrid_check_every=check_every)
    recorder = StepRecorder(trainer)
    trainer.add_callback(recorder)
    trainer.train()
    predicted = [r for r in recorder.records if r["phase"] == "predict"]
    assert len(predicted) >= 5 and trainer.hybrid_stats()["backward_skipped"] == len(predicted)
    assert not recorder.applied and not any(r["applied"] for r in predicted)
    assert all(r["backward"] == 0 and r["opt_unchanged"] and r["exact_delta"] for r in predicted)


def test_a_run_goes_through_every_phase_in_order_and_counts_add_up(tmp_path):
    trainer = hybrid_trainer(tmp_path, max_steps=60, hybrid_warmup_steps=8, hybrid_full_steps=4)
    trainer.train()
    phases = [row["phase"] for row in trainer.hybrid_timeline]
    letters = "".join(p[0] for p in phases)
    assert set(letters) == {"w", "f", "p", "c"}
    assert letters.startswith("w" * 8 + "ffff")
    # After warmup: cycles of FULL+ then PREDICT+ closed by CORRECT (a divergence may cut a phase short).
    assert re.fullmatch(r"w{8}(f+p+c?)*f*p*c?", letters), letters
    stats = trainer.hybrid_stats()
    per_phase = stats["steps_per_phase"]
    assert per_phase == {p.value: phases.count(p.value) for p in Phase}
    assert sum(per_phase.values()) == stats["steps"] == trainer.state.global_step == 60
    assert stats["backward_run"] + stats["backward_skipped"] == 60
    assert stats["backward_skipped"] == per_phase["predict"]
    assert 0 < stats["backward_skipped_fraction"] < 1
    logged = [e for e in trainer.state.log_history if "hybrid/phase" in e]
    assert logged and logged[-1]["hybrid/backward_skipped"] == stats["backward_skipped"]


def test_blind_predict_steps_run_no_forward(tmp_path):
    trainer = hybrid_trainer(tmp_path, max_steps=40, hybrid_check_every=0)
    forwards: list[int] = []
    trainer.model.register_forward_hook(lambda *a: forwards.append(trainer.state.global_step))
    trainer.train()
    predicted_steps = {row["step"] - 1 for row in trainer.hybrid_timeline if row["phase"] == "predict"}
    assert predicted_steps
    assert not predicted_steps.intersection(forwards)
    assert trainer.hybrid_stats()["predict_blind"] == len(predicted_steps)


class _LossFault:
    """Forward hook that corrupts the loss of one checked predict step (after a delta was applied)."""

    def __init__(self, trainer, make_bad):
        self.trainer = trainer
        self.make_bad = make_bad
        self.fired_at: int | None = None
        self.snapshot: dict[str, torch.Tensor] = {}

    def __call__(self, module, inputs, output):
        engine = self.trainer.engine
        if (
            self.fired_at is None
            and engine.controller.phase is Phase.PREDICT
            and engine.phase is not None
            and engine.phase.predicted >= 1
        ):
            self.fired_at = self.trainer.state.global_step
            self.snapshot = {k: v.clone() for k, v in engine.guard.snapshot.items()}
            output.loss = self.make_bad(output.loss)
        return output


def _run_with_loss_fault(tmp_path, make_bad):
    trainer = hybrid_trainer(tmp_path, max_steps=45)
    fault = _LossFault(trainer, make_bad)
    trainer.model.register_forward_hook(fault)
    after_fault: dict[str, torch.Tensor] = {}

    def check(tr):
        for name, p in tr.model.named_parameters():
            assert torch.isfinite(p).all(), f"non-finite weight {name} at step {tr.state.global_step}"
        if fault.fired_at is not None and tr.state.global_step == fault.fired_at + 1:
            after_fault.update({n: p.detach().clone() for n, p in tr.engine.params.items()})

    trainer.add_callback(EveryStep(trainer, check))
    trainer.train()
    assert fault.fired_at is not None
    return trainer, fault, after_fault


def _assert_rolled_back_and_forced_full(trainer, fault, after_fault):
    assert all(torch.equal(after_fault[n], fault.snapshot[n]) for n in fault.snapshot)
    timeline = trainer.hybrid_timeline
    assert timeline[fault.fired_at]["rolled_back"]
    following = [row["phase"] for row in timeline[fault.fired_at + 1 : fault.fired_at + 1 + 3]]
    assert following == ["full"] * 3
    assert trainer.hybrid_stats()["rollbacks"] >= 1


def test_nan_loss_in_a_predict_step_rolls_back_and_forces_full(tmp_path):
    trainer, fault, after = _run_with_loss_fault(tmp_path, lambda loss: loss * float("nan"))
    _assert_rolled_back_and_forced_full(trainer, fault, after)


def test_loss_spike_in_a_predict_step_rolls_back_and_forces_full(tmp_path):
    trainer, fault, after = _run_with_loss_fault(tmp_path, lambda loss: loss * 20.0)
    _assert_rolled_back_and_forced_full(trainer, fault, after)


class _ExplodingPredictor(EMAPredictor):
    name = "test_exploding"

    def predict(self, steps_ahead):
        out = super().predict(steps_ahead)
        return None if out is None else {k: v * 1e6 for k, v in out.items()}


def test_exploding_predicted_delta_is_held_to_the_trust_region(tmp_path):
    register_predictor(_ExplodingPredictor.name, _ExplodingPredictor)
    try:
        trainer = hybrid_trainer(
            tmp_path, max_steps=40, hybrid_predictor="test_exploding", hybrid_max_delta=0.01
        )
        recorder = StepRecorder(trainer)
        trainer.add_callback(recorder)
        trainer.train()
    finally:
        unregister_predictor(_ExplodingPredictor.name)
    assert trainer.hybrid_stats()["clipped_tensors"] > 0
    assert len(recorder.applied) == len(recorder.norms_at_apply) >= 5
    for deltas, norms in zip(recorder.applied, recorder.norms_at_apply, strict=True):
        for name, delta in deltas.items():
            assert torch.isfinite(delta).all()
            # per tensor at most max_delta of the weight as it was when the delta was applied
            assert float(delta.norm()) <= 0.01 * norms[name] * (1 + 1e-5) + 1e-7, name
    for p in trainer.model.parameters():
        assert torch.isfinite(p).all()


def test_probe_is_measured_at_each_phase_boundary_and_charged_in_compute_units(tmp_path):
    trainer = hybrid_trainer(tmp_path, max_steps=40, hybrid_probe_batches=2, per_device_eval_batch_size=5)
    trainer.train()
    engine = trainer.engine
    assert engine.probe() == engine.probe()  # deterministic: eval mode, fixed batches
    stats = trainer.hybrid_stats()
    closed = sum(row["phase"] == "correct" for row in trainer.hybrid_timeline)
    assert closed >= 1
    assert stats["probe_evaluations"] == stats["predict_phases"] + closed  # one at each start and end
    probe_cost = 2.0  # 2 training-sized batches, forward only (whatever the eval batch size)
    assert stats["compute_units"] == (
        3 * stats["backward_run"] + stats["predict_checked"] + stats["probe_evaluations"] * probe_cost
    )


def test_a_probe_that_says_worse_rolls_every_phase_back(tmp_path, monkeypatch):
    trainer = hybrid_trainer(tmp_path, max_steps=40, hybrid_probe_batches=1)
    rising = iter(range(10_000))
    # every phase made the probe loss worse
    monkeypatch.setattr(hf_hybrid.trainer, "_loss_probe", lambda trainer: lambda: float(next(rising)))
    weights: list[dict[str, torch.Tensor]] = []  # the trainable weights after each step
    trainer.add_callback(
        EveryStep(
            trainer, lambda tr: weights.append({n: p.detach().clone() for n, p in tr.engine.params.items()})
        )
    )
    trainer.train()
    phases = [row["phase"] for row in trainer.hybrid_timeline]
    correct_rows = [row for row in trainer.hybrid_timeline if row["phase"] == "correct"]
    assert correct_rows and all(row["rolled_back"] for row in correct_rows)
    assert trainer.hybrid_stats()["rollbacks"] >= len(correct_rows)
    # each CORRECT step ends with the weights bit for bit as they were when its phase opened (the step
    # before its first PREDICT step), although its predicted steps had moved them
    assert len(weights) == len(phases) == 40
    for end in (i for i, phase in enumerate(phases) if phase == "correct"):
        start = end
        while phases[start - 1] == "predict":
            start -= 1
        opened = weights[start - 1]
        assert any(not torch.equal(weights[end - 1][n], opened[n]) for n in opened), end
        assert all(torch.equal(weights[end][n], opened[n]) for n in opened), end


class _Stream(torch.utils.data.IterableDataset):
    """The training examples as a stream: no length, so no fixed probe examples can be drawn from it."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __iter__(self):
        return iter(self.dataset)


def test_the_probe_refuses_an_iterable_dataset_before_any_step(tmp_path):
    from helpers import hybrid_args, tiny_data

    train, _ = tiny_data()
    model = tiny_gpt2()
    trainer = HybridHFTrainer(
        model=model,
        args=hybrid_args(tmp_path, max_steps=20, hybrid_probe_batches=2),
        train_dataset=_Stream(train),
    )
    forwards = []
    model.register_forward_hook(lambda *args: forwards.append(1))
    with pytest.raises(ValueError, match=r"`hybrid_probe_batches` needs a train_dataset with a length"):
        trainer.train()
    assert forwards == [] and trainer.state.global_step == 0
