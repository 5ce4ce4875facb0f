"""peft, QLoRA and bitsandbytes optimizers: the engine predicts exactly the adapters, nothing else moves.

Every run here has predict phases (asserted): the claims are about runs in which predicted updates
were really applied.
"""

from __future__ import annotations

import pytest
import torch
from helpers import hybrid_args, hybrid_trainer, lora_gpt2, tiny_data, tiny_gpt2
from transformers import TrainerCallback

from hf_hybrid import HybridHFTrainer

pytest.importorskip("peft")
from peft import LoraConfig, PeftModel  # noqa: E402


def _lora_config(**overrides):
    config = {
        "r": 4,
        "lora_alpha": 8,
        "target_modules": ["c_attn"],
        "fan_in_fan_out": True,
        "task_type": "CAUSAL_LM",
    }
    config.update(overrides)
    return LoraConfig(**config)


class AppliedRecorder(TrainerCallback):
    """Records which parameters each applied predicted delta touched, and what the snapshot covered."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.applied: list[set[str]] = []
        self.snapshots: list[tuple[set[str], int]] = []

    def on_train_begin(self, args, state, control, **kwargs):
        guard = self.trainer.engine.guard
        original = guard.apply

        def recording_apply(deltas, *args, **kwargs):
            refused, final = original(deltas, *args, **kwargs)
            if refused is None:
                self.applied.append(set(final))
            return refused, final

        guard.apply = recording_apply

    def on_step_end(self, args, state, control, **kwargs):
        guard = self.trainer.engine.guard
        if guard.has_snapshot:
            nbytes = sum(t.numel() * t.element_size() for t in guard.snapshot.values())
            self.snapshots.append((set(guard.snapshot), nbytes))


def _frozen(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}


def _trainable(model):
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def _assert_unchanged(before, model):
    now = dict(model.named_parameters())
    changed = [n for n, p in before.items() if not torch.equal(p, now[n])]
    assert not changed, f"frozen weights moved: {changed[:5]}"


@pytest.mark.parametrize(
    ("how", "predictor", "buffers_per_param"),
    [("peft_config", "ema", 1), ("ready_peft_model", "ema", 1), ("peft_config", "adam", 0)],
)
def test_lora_engine_covers_exactly_the_adapters(tmp_path, how, predictor, buffers_per_param):
    overrides = {"max_steps": 40, "hybrid_predictor": predictor}
    if how == "peft_config":
        train, _ = tiny_data()
        trainer = HybridHFTrainer(
            model=tiny_gpt2(),
            args=hybrid_args(tmp_path, **overrides),
            train_dataset=train,
            peft_config=_lora_config(),
        )
    else:
        trainer = hybrid_trainer(tmp_path, model=lora_gpt2(), **overrides)
    assert isinstance(trainer.model, PeftModel)
    adapters = _trainable(trainer.model)
    assert adapters and all("lora_" in n for n in adapters)
    frozen_before = _frozen(trainer.model)
    adapters_before = {n: p.detach().clone() for n, p in adapters.items()}
    recorder = AppliedRecorder(trainer)
    trainer.add_callback(recorder)
    trainer.train()

    stats = trainer.hybrid_stats()
    assert stats["steps_per_phase"]["predict"] > 0
    assert set(trainer.engine.params) == set(adapters)
    _assert_unchanged(frozen_before, trainer.model)
    assert any(not torch.equal(adapters_before[n], p) for n, p in adapters.items())
    assert all(torch.isfinite(p).all() for p in adapters.values())

    assert recorder.applied, "no predicted update was applied"
    assert all(names <= set(adapters) for names in recorder.applied)
    adapter_fp32_bytes = sum(p.numel() * 4 for p in adapters.values())
    assert recorder.snapshots
    assert all(names == set(adapters) for names, _ in recorder.snapshots)
    assert all(nbytes == adapter_fp32_bytes for _, nbytes in recorder.snapshots)

    # The predictor's buffers are fp32 and per adapter: one per parameter for the EMA, none for the Adam
    # replay (it reads the optimizer's moments); the logged telemetry says the same number.
    assert trainer.engine.predictor.nbytes() == buffers_per_param * adapter_fp32_bytes
    assert stats["predictor_bytes"] == buffers_per_param * adapter_fp32_bytes
    logged = [e["hybrid/predictor_bytes"] for e in trainer.state.log_history if "hybrid/predictor_bytes" in e]
    assert logged and logged[-1] == buffers_per_param * adapter_fp32_bytes


def test_peft_config_with_a_peft_model_is_refused(tmp_path):
    with pytest.raises(ValueError, match="already a PeftModel"):
        HybridHFTrainer(model=lora_gpt2(), args=hybrid_args(tmp_path), peft_config=_lora_config())


# ---- bitsandbytes optimizers -----------------------------------------------------------------------


class OptimizerStateRecorder(TrainerCallback):
    """Optimizer state before/after every step: predicted steps must leave it exactly as it was."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.unchanged: dict[str, list[bool]] = {"predict": [], "real": []}

    def _state(self):
        return [
            {k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()}
            for s in self.trainer.optimizer.state.values()
        ]

    def on_step_begin(self, args, state, control, **kwargs):
        self.before = self._state()

    def on_step_end(self, args, state, control, **kwargs):
        after = self._state()
        same = len(after) == len(self.before) and all(
            a.keys() == b.keys()
            and all(torch.equal(a[k], b[k]) if torch.is_tensor(a[k]) else a[k] == b[k] for k in a)
            for a, b in zip(after, self.before, strict=True)
        )
        phase = self.trainer.hybrid_timeline[-1]["phase"]
        self.unchanged["predict" if phase == "predict" else "real"].append(same)


@pytest.mark.parametrize("optim", ["adamw_bnb_8bit", "paged_adamw_8bit", "lion_8bit"])
def test_bitsandbytes_optimizers_are_untouched_by_predicted_steps(tmp_path, optim):
    pytest.importorskip("bitsandbytes")
    trainer = hybrid_trainer(tmp_path, max_steps=40, optim=optim)
    recorder = OptimizerStateRecorder(trainer)
    trainer.add_callback(recorder)
    trainer.train()
    inner = trainer.optimizer.optimizer.optimizer  # HybridOptimizer -> accelerate's wrapper -> bnb
    assert type(inner).__module__.startswith("bitsandbytes"), type(inner)
    states = list(trainer.optimizer.state.values())
    assert any(v.dtype == torch.uint8 for s in states for v in s.values() if torch.is_tensor(v)), (
        "no 8-bit optimizer state: the 8-bit path was not exercised"
    )
    assert trainer.hybrid_stats()["steps_per_phase"]["predict"] > 0
    assert recorder.unchanged["predict"] and all(recorder.unchanged["predict"])
    assert not any(recorder.unchanged["real"])  # the check does see a real step's state change
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


def test_adam_replay_predictor_refuses_a_bitsandbytes_optimizer(tmp_path):
    """`hybrid_predictor='adam'` reads torch Adam/AdamW moments; a bnb optimizer is refused before a step."""
    pytest.importorskip("bitsandbytes")
    trainer = hybrid_trainer(tmp_path, max_steps=2, optim="adamw_bnb_8bit", hybrid_predictor="adam")
    with pytest.raises(ValueError, match="hybrid_predictor='adam'.*adamw_torch"):
        trainer.train()
    assert trainer.state.global_step == 0


# ---- 4-bit QLoRA -----------------------------------------------------------------------------------


def test_qlora_4bit_predicts_only_the_adapters_and_never_writes_quantised_weights(tmp_path):
    pytest.importorskip("bitsandbytes")
    from bitsandbytes.nn import Linear4bit, Params4bit
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    tiny_gpt2().save_pretrained(tmp_path / "base")
    quantized = AutoModelForCausalLM.from_pretrained(
        tmp_path / "base",
        quantization_config=BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32
        ),
    )
    train, _ = tiny_data()
    trainer = HybridHFTrainer(
        model=quantized,
        args=hybrid_args(tmp_path / "out", max_steps=40, optim="paged_adamw_8bit"),
        train_dataset=train,
        peft_config=_lora_config(fan_in_fan_out=False),
    )
    model = trainer.model
    four_bit = {n: p for n, p in model.named_parameters() if isinstance(p, Params4bit)}
    assert len(four_bit) == 8  # c_attn, c_proj, c_fc, mlp.c_proj in both layers
    absmax_before = {
        n: m.weight.quant_state.absmax.clone() for n, m in model.named_modules() if isinstance(m, Linear4bit)
    }
    frozen_before = _frozen(model)
    assert set(four_bit) <= set(frozen_before)
    adapters = _trainable(model)
    recorder = AppliedRecorder(trainer)
    trainer.add_callback(recorder)
    trainer.train()

    assert trainer.hybrid_stats()["steps_per_phase"]["predict"] > 0
    assert set(trainer.engine.params) == set(adapters)
    assert all("lora_" in n and p.dtype == torch.float32 for n, p in trainer.engine.params.items())
    assert recorder.applied and all(names <= set(adapters) for names in recorder.applied)
    _assert_unchanged(frozen_before, model)  # the packed 4-bit weights included, bit for bit
    for name, module in model.named_modules():
        if isinstance(module, Linear4bit):
            assert torch.equal(module.weight.quant_state.absmax, absmax_before[name]), name
    assert all(torch.isfinite(p).all() for p in adapters.values())
    assert trainer.engine.predictor.nbytes() == sum(p.numel() * 4 for p in adapters.values())
