"""Mixed precision: bf16 autocast, a bf16 model (no small delta lost), fp16 with a GradScaler (GPU).

Every run here has predict phases (asserted).
"""

from __future__ import annotations

import pytest
import torch
from helpers import hybrid_trainer, tiny_gpt2
from transformers import AutoModelForCausalLM, TrainerCallback

BF16_EPS = torch.finfo(torch.bfloat16).eps  # 2**-7: one bf16 ulp relative to the value


def _finite(model) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


def test_bf16_autocast_on_cpu_with_predict_phases(tmp_path):
    trainer = hybrid_trainer(tmp_path, max_steps=40, bf16=True)
    dtypes: dict[str, set[torch.dtype]] = {"predict": set(), "real": set()}

    def record(module, inputs, output):
        plan = trainer.engine.plan  # set between begin_step() and finish_step(): during the step's forwards
        if plan is not None:
            dtypes["predict" if plan.phase.value == "predict" else "real"].add(output.dtype)

    trainer.model.transformer.h[0].mlp.c_fc.register_forward_hook(record)
    trainer.train()
    assert trainer.hybrid_stats()["steps_per_phase"]["predict"] > 0
    # autocast is on in the forward-only predict steps as in the real ones; the weights stay fp32
    assert dtypes == {"predict": {torch.bfloat16}, "real": {torch.bfloat16}}
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
    assert _finite(trainer.model)


class CompensationChecker(TrainerCallback):
    """Follows every chain of consecutive predicted writes into a bf16 model.

    For each chain it keeps, in fp32, the parameters at its start plus the sum of the applied deltas
    (the exact result), and a naive copy that adds each delta in bf16 (what rounding every write
    would give). After each write it compares the parameter + the guard's carried compensation
    with the exact result.
    """

    def __init__(self, trainer):
        self.trainer = trainer
        self.last_step = -2
        self.writes = 0
        self.longest_chain = 0
        self.worst_tracking = 0.0  # max |(p + carry) - exact| / (|base| + sum|d|), elementwise
        self.worst_rounding = 0.0  # max (|p - exact| - eps/2 |exact|): > 0 means p is not exact rounded
        self.tracking_error = 0.0  # sum |(p + carry) - exact|
        self.naive_error = 0.0  # sum |naive - exact|
        self.sub_ulp = 0  # delta elements smaller than half an ulp of their weight

    def on_train_begin(self, args, state, control, **kwargs):
        guard = self.trainer.engine.guard
        original = guard.apply

        def checking_apply(deltas, *args, **kwargs):
            step = self.trainer.state.global_step
            if step != self.last_step + 1:
                assert not guard.compensation, "a new chain must not start with a stale carry"
                self.base = {n: p.detach().float().clone() for n, p in guard.params.items()}
                self.total = {n: torch.zeros_like(b) for n, b in self.base.items()}
                self.magnitude = {n: b.abs() for n, b in self.base.items()}
                self.naive = {n: p.detach().clone() for n, p in guard.params.items()}
                self.chain = 0
            refused, final = original(deltas, *args, **kwargs)
            if refused is not None:
                self.last_step = -2
                return refused, final
            self.last_step = step
            self.chain += 1
            self.longest_chain = max(self.longest_chain, self.chain)
            self.writes += 1
            for name, delta in final.items():
                p = guard.params[name].detach()
                assert p.dtype == torch.bfloat16
                half_ulp = (
                    BF16_EPS / 2 * torch.exp2(torch.floor(torch.log2(p.float().abs().clamp_min(1e-30))))
                )
                self.sub_ulp += int((delta.abs() < half_ulp).sum())
                self.total[name] += delta
                self.magnitude[name] += delta.abs()
                exact = self.base[name] + self.total[name]
                tracked = p.float() + guard.compensation[name]
                self.naive[name] = (self.naive[name].float() + delta).to(torch.bfloat16)
                scale = self.magnitude[name].clamp_min(1e-30)
                self.worst_tracking = max(self.worst_tracking, float(((tracked - exact).abs() / scale).max()))
                self.worst_rounding = max(
                    self.worst_rounding,
                    float(((p.float() - exact).abs() - BF16_EPS / 2 * exact.abs() - 2**-20 * scale).max()),
                )
                self.tracking_error += float((tracked - exact).abs().sum())
                self.naive_error += float((self.naive[name].float() - exact).abs().sum())
            return refused, final

        guard.apply = checking_apply


def test_bf16_model_keeps_small_predicted_deltas(tmp_path):
    """A model loaded in bf16 (full fine-tuning): the guard's fp32 carry keeps sub-ulp updates."""
    tiny_gpt2().save_pretrained(tmp_path / "base")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "base", dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    trainer = hybrid_trainer(tmp_path / "out", model=model, max_steps=40, learning_rate=3e-4)
    checker = CompensationChecker(trainer)
    trainer.add_callback(checker)
    trainer.train()

    assert trainer.hybrid_stats()["steps_per_phase"]["predict"] > 0
    assert checker.writes > 0 and checker.longest_chain >= 2
    assert checker.sub_ulp > 0, "no sub-ulp delta: the test does not exercise the carry"
    # parameter + carry is the fp32 sum of the applied deltas, to fp32 rounding (far below a bf16 ulp)
    assert checker.worst_tracking <= 2**-16
    # and the bf16 parameter itself is that exact value rounded to nearest
    assert checker.worst_rounding <= 0.0
    # rounding every write instead would drift by orders of magnitude more
    assert checker.naive_error > 1000 * checker.tracking_error
    assert _finite(trainer.model)
    assert all(p.dtype == torch.bfloat16 for p in trainer.model.parameters())


class ScalerSpy:
    """Counts GradScaler.step/update calls (they must happen in real steps only)."""

    def __init__(self, scaler):
        self.steps = 0
        self.updates = 0
        step, update = scaler.step, scaler.update

        def counting_step(*args, **kwargs):
            self.steps += 1
            return step(*args, **kwargs)

        def counting_update(*args, **kwargs):
            self.updates += 1
            return update(*args, **kwargs)

        scaler.step = counting_step
        scaler.update = counting_update


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="fp16 with a GradScaler needs CUDA")
def test_fp16_grad_scaler_survives_predict_phases(tmp_path):
    trainer = hybrid_trainer(tmp_path, max_steps=60, fp16=True, use_cpu=False)
    scaler = trainer.accelerator.scaler
    assert scaler is not None, "fp16 on CUDA should give accelerate a GradScaler"
    spy = ScalerSpy(scaler)
    trainer.train()  # a scaler.step/update without inf checks would raise here
    stats = trainer.hybrid_stats()
    assert stats["steps_per_phase"]["predict"] > 0
    # GradScaler.step/update ran exactly once per real step, never in a predicted one
    assert spy.steps == spy.updates == stats["backward_run"]
    scale = float(scaler.get_scale())
    assert 1.0 <= scale < float("inf")
    assert _finite(trainer.model)
    lrs = [e["learning_rate"] for e in trainer.state.log_history if "learning_rate" in e and "loss" in e]
    assert len(lrs) == 60 and lrs[-1] < lrs[0]  # the linear schedule kept decaying through the run
