"""`hf_hybrid.sft` (TRL): `HybridSFTTrainer` is `SFTTrainer` at the defaults, past the warmup; with
predict phases forced on it trains, skips backward passes, and resumes from a checkpoint saved inside a
predict phase to the uninterrupted run's weights, bit for bit; with `packing=True` and with
`padding_free=True`. And the README's TRL section runs as written.

The model is a tiny Llama built from a config over the example's byte-level tokenizer (no download);
the data are the example's stdlib prompt/completion pairs (mixed lengths), completions cut to 48
characters so that padding-free batches (no `max_length`) stay short.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import SaveAt, counters

from hf_hybrid.engine.phases import Phase

pytest.importorskip("trl")
from datasets import Dataset  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402
from trl import SFTConfig, SFTTrainer  # noqa: E402

from hf_hybrid.sft import HybridSFTConfig, HybridSFTTrainer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
COMPLETION_CHARS = 48
LAYOUTS = {
    "packing": {"packing": True, "max_length": 64},
    "padding_free": {"padding_free": True, "max_length": None},  # TRL refuses a max_length without packing
}
FORCED = {  # predict phases from step 6 on: a short warmup, and any measured confidence will do
    "hybrid_warmup_steps": 4,
    "hybrid_full_steps": 1,
    "hybrid_min_history": 2,
    "hybrid_confidence_threshold": 0.0,
    "hybrid_max_predict_steps": 2,
}


def _example() -> Any:
    name = "run_sft_trl_hybrid"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return _example().byte_level_tokenizer()


@pytest.fixture(scope="module")
def pairs() -> Dataset:
    train, _ = _example().stdlib_docstring_pairs(64, 1)
    return train.map(lambda row: {"completion": row["completion"][:COMPLETION_CHARS]})


def tiny_llama(tokenizer: Any, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return LlamaForCausalLM(config)


def _config(cls: type, output_dir: Path, layout: str, **overrides: Any) -> Any:
    values = {
        "output_dir": str(output_dir),
        "max_steps": 20,
        "per_device_train_batch_size": 4,
        "learning_rate": 3e-3,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "use_cpu": True,
        "bf16": False,
        "gradient_checkpointing": False,
        "disable_tqdm": True,
        "seed": 0,
        **LAYOUTS[layout],
        **overrides,
    }
    return cls(**values)


def _train(cls: type, args: Any, pairs: Dataset, tokenizer: Any, **kwargs: Any) -> Any:
    return cls(
        model=tiny_llama(tokenizer), args=args, train_dataset=pairs, processing_class=tokenizer, **kwargs
    )


def _step_logs(trainer: Any, key: str) -> list[float]:
    return [e[key] for e in trainer.state.log_history if key in e and "train_runtime" not in e]


def _weights(trainer: Any) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in trainer.model.state_dict().items()}


def _assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    different = [name for name in a if not torch.equal(a[name], b[name])]
    assert different == []


class CountBackward:
    """Counts the backward passes the loop really runs (the trainer's own counters are not trusted)."""

    def __init__(self, trainer: Any) -> None:
        self.calls = 0
        self._backward = trainer.accelerator.backward
        trainer.accelerator.backward = self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self._backward(*args, **kwargs)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_the_defaults_train_exactly_like_sft_trainer_past_the_warmup(tmp_path, pairs, tokenizer, layout):
    """No `hybrid_*` setting: 110 steps, so the default 100-step warmup ends and the engine runs its
    FULL steps awake; every loss, gradient norm and weight is SFTTrainer's."""
    steps = 110
    plain = _train(
        SFTTrainer, _config(SFTConfig, tmp_path / "plain", layout, max_steps=steps), pairs, tokenizer
    )
    plain.train()
    hybrid = _train(
        HybridSFTTrainer,
        _config(HybridSFTConfig, tmp_path / "hybrid", layout, max_steps=steps),
        pairs,
        tokenizer,
    )
    hybrid.train()
    warmup = HybridSFTConfig.hybrid_warmup_steps
    stats = hybrid.hybrid_stats()
    assert stats["steps_per_phase"] == {"warmup": warmup, "full": steps - warmup, "predict": 0, "correct": 0}
    for key in ("loss", "grad_norm", "mean_token_accuracy"):
        assert _step_logs(hybrid, key) == _step_logs(plain, key) and len(_step_logs(plain, key)) == steps
    _assert_same_weights(_weights(plain), _weights(hybrid))


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_forced_predict_phases_skip_backward_and_resume_exactly(tmp_path, pairs, tokenizer, layout):
    """Predict phases forced on: the run trains, its predicted steps run no backward pass (counted at
    `accelerator.backward`), and a run resumed from a checkpoint saved inside a predict phase ends on the
    uninterrupted run's losses, counters and weights, bit for bit."""
    steps = 20
    args = _config(
        HybridSFTConfig, tmp_path / "full", layout, save_strategy="steps", save_steps=1000, **FORCED
    )
    first = _train(HybridSFTTrainer, args, pairs, tokenizer)
    initial = _weights(first)
    backward = CountBackward(first)
    saver = SaveAt(first, wanted=("mid_predict",))
    first.add_callback(saver)
    first.train()

    stats = first.hybrid_stats()
    phases = stats["steps_per_phase"]
    assert phases["predict"] >= 4 and phases["warmup"] == FORCED["hybrid_warmup_steps"], phases
    assert stats["backward_skipped"] == phases["predict"] and stats["rollbacks"] == 0
    assert backward.calls == stats["backward_run"] == steps - phases["predict"]  # gradient accumulation 1
    logged = _step_logs(first, "hybrid/phase")
    assert logged.count(Phase.PREDICT.index) == phases["predict"] and len(logged) == steps
    assert len(_step_logs(first, "grad_norm")) == stats["backward_run"]  # a predicted step has no gradient
    losses = _step_logs(first, "loss")
    assert sum(losses[-4:]) < sum(losses[:4])  # it trains (measured: 5.5 -> 4.4 and lower)
    final = _weights(first)
    assert all(not torch.equal(initial[name], final[name]) for name in final if name.endswith("weight"))

    saved = saver.saved["mid_predict"]
    checkpoint = tmp_path / "full" / f"checkpoint-{saved}"
    assert (checkpoint / "hybrid_state.safetensors").is_file()
    args = _config(HybridSFTConfig, tmp_path / "resumed", layout, save_strategy="no", **FORCED)
    resumed = _train(HybridSFTTrainer, args, pairs, tokenizer)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert counters(resumed.hybrid_stats()) == counters(stats)
    assert 0 < saved < steps - 4
    # its log holds the checkpoint's history, then the steps it trained itself
    assert _step_logs(resumed, "loss") == losses
    assert Phase.PREDICT.index in _step_logs(resumed, "hybrid/phase")[saved:]  # the resumed engine predicted
    _assert_same_weights(final, _weights(resumed))


README_BLOCK = re.compile(r"<!-- trl-example:start -->\s*```python\n(.*?)```", re.S)


def test_the_readme_trl_section_runs_as_written(tmp_path, monkeypatch, pairs, tokenizer):
    """The README's TRL block, line for line, in a scratch folder holding its `pairs.jsonl`; the two
    `from_pretrained` calls (a Hub id: a download) return a tiny Llama and the byte-level tokenizer."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    block = README_BLOCK.search((ROOT / "README.md").read_text())
    assert block, "README.md lost its TRL example (<!-- trl-example:start -->)"
    model = tiny_llama(tokenizer)
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: model)
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", lambda *a, **k: tokenizer)
    monkeypatch.chdir(tmp_path)
    with open("pairs.jsonl", "w") as f:
        for row in pairs.select(range(24)):
            f.write(json.dumps({"prompt": row["prompt"], "completion": row["completion"]}) + "\n")
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}
    namespace: dict[str, Any] = {}
    exec(compile(block.group(1), "README.md", "exec"), namespace)  # noqa: S102 - the README's own code

    trainer = namespace["trainer"]
    assert isinstance(trainer, HybridSFTTrainer) and isinstance(trainer.model, PeftModel)
    assert trainer.args.packing and "seq_lengths" in trainer.train_dataset.column_names  # TRL packed it
    stats = trainer.hybrid_stats()
    assert stats["enabled"] and stats["steps"] == trainer.state.global_step >= 1
    trained = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert trained and all("lora_" in n for n in trained)
    changed = [n for n, p in trainer.model.named_parameters() if "lora_B" in n and p.abs().sum() > 0]
    assert changed  # lora_B starts at zero: the adapters were trained
    base = {n.removeprefix("base_model.model."): p for n, p in trainer.model.named_parameters()}
    kept = [n for n in initial if n in base]  # the layers peft did not wrap (embeddings, norms, MLPs)
    assert kept and all(torch.equal(base[n], initial[n]) for n in kept)  # frozen: untouched
    assert (tmp_path / "sft-out" / "adapter_model.safetensors").is_file()
