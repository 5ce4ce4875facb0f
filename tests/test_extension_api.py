"""The public extension API, as docs/extending.md shows it: a user's predictor, by name and as an instance."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from helpers import counters, hybrid_args, hybrid_trainer, tiny_data, tiny_gpt2

import hf_hybrid
from hf_hybrid import HybridHFTrainer, available_predictors, unregister_predictor

EXTENDING = Path(__file__).resolve().parents[1] / "docs" / "extending.md"


@pytest.fixture
def readme_example(tmp_path, monkeypatch):
    """Run the extension page's block as a user would (in a scratch folder); yield its namespace."""
    text = EXTENDING.read_text()
    block = re.search(r"<!-- extension-example:start -->\s*```python\n(.*?)```", text, re.S)
    assert block, "docs/extending.md lost its extension example"
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(block.group(1), "extending.md", "exec"), namespace)  # noqa: S102 - the page's own code
    yield namespace
    unregister_predictor("last-update")


def test_the_readme_example_registers_a_predictor_the_arguments_accept(readme_example):
    assert "last-update" in available_predictors()
    args = readme_example["args"]
    assert args.hybrid_predictor == "last-update" and args.hybrid_predictor_kwargs == {"damping": 0.3}
    assert args.engine_config().predictor_kwargs == {"damping": 0.3}


def test_a_registered_predictor_trains_by_name(readme_example, tmp_path):
    trainer = hybrid_trainer(tmp_path, max_steps=30, hybrid_predictor="last-update")
    trainer.train()
    predictor = trainer.engine.predictor
    assert type(predictor) is readme_example["LastUpdate"] and predictor.damping == 0.5
    stats = trainer.hybrid_stats()
    assert stats["predictor"] == "last-update" and stats["steps_per_phase"]["predict"] > 0


def test_an_instance_is_used_and_resumed_from_its_checkpoint(readme_example, tmp_path):
    cls = readme_example["LastUpdate"]
    mine = cls(damping=0.25)
    straight = HybridHFTrainer(
        model=tiny_gpt2(), args=hybrid_args(tmp_path, max_steps=30, save_strategy="steps", save_steps=18),
        train_dataset=tiny_data()[0], predictor=mine,
    )  # fmt: skip
    straight.train()
    assert straight.engine.predictor is mine and mine.observed > 0
    assert straight.hybrid_stats()["steps_per_phase"]["predict"] > 0
    saved = torch.load(tmp_path / "checkpoint-18" / "training_args.bin", weights_only=False)
    assert saved.hybrid_predictor == "ema"  # the argument was not used: the instance was

    resumed_instance = cls(damping=0.25)
    resumed = HybridHFTrainer(
        model=tiny_gpt2(), args=hybrid_args(tmp_path, max_steps=30), train_dataset=tiny_data()[0],
        predictor=resumed_instance,
    )  # fmt: skip
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-18"))
    assert resumed.engine.predictor is resumed_instance
    for name, value in resumed.model.named_parameters():
        assert torch.equal(value, dict(straight.model.named_parameters())[name]), name
    assert counters(resumed.hybrid_stats()) == counters(straight.hybrid_stats())


def test_a_predictor_that_is_not_a_delta_predictor_is_refused(tmp_path):
    with pytest.raises(TypeError, match="`predictor` must be a hf_hybrid.DeltaPredictor instance"):
        HybridHFTrainer(model=tiny_gpt2(), args=hybrid_args(tmp_path), predictor=object())


def test_the_extension_api_is_exported():
    """Each name is the very object the engine itself uses (docs/extending.md imports them from
    `hf_hybrid`): a subclass of the exported `DeltaPredictor` is what the engine accepts, a predictor
    registered through the exported function is what it finds."""
    import importlib

    homes = {
        "DeltaPredictor": "hf_hybrid.engine.predictor",
        "register_predictor": "hf_hybrid.engine.predictor",
        "unregister_predictor": "hf_hybrid.engine.predictor",
        "available_predictors": "hf_hybrid.engine.predictor",
        "HybridEngine": "hf_hybrid.engine.engine",
        "EngineConfig": "hf_hybrid.engine.config",
        "PhaseSchedule": "hf_hybrid.engine.phases",
        "StepRecord": "hf_hybrid.engine.engine",
        "HybridOptimizer": "hf_hybrid.engine.optimizer",
    }
    assert set(homes) <= set(hf_hybrid.__all__)
    for name, module in homes.items():
        assert getattr(hf_hybrid, name) is getattr(importlib.import_module(module), name), name
    exported = type("_Exported", (_Unregistered,), {"name": "test_exported"})
    hf_hybrid.register_predictor("test_exported", exported)
    try:
        assert "test_exported" in hf_hybrid.available_predictors()
        engine = hf_hybrid.HybridEngine(
            {"w": torch.nn.Parameter(torch.zeros(3))}, hf_hybrid.EngineConfig(predictor="test_exported")
        )
        assert type(engine.predictor) is exported and isinstance(engine.predictor, hf_hybrid.DeltaPredictor)
    finally:
        hf_hybrid.unregister_predictor("test_exported")
    assert "test_exported" not in hf_hybrid.available_predictors()


class _Unregistered(hf_hybrid.DeltaPredictor):
    """A user's predictor that was never registered: the last real update, repeated."""

    def __init__(self) -> None:
        super().__init__()
        self.last: dict[str, torch.Tensor] = {}

    def observe(self, deltas):
        self.last = {name: d.clone() for name, d in deltas.items()}
        self.observed += 1

    def predict(self, steps_ahead):
        return dict(self.last) or None

    def reset(self):
        self.last, self.observed = {}, 0

    def tensors(self):
        return {f"last.{name}": t for name, t in self.last.items()}

    def load_tensors(self, tensors):
        self.last = {name.removeprefix("last."): t.clone() for name, t in tensors.items()}


def test_an_unregistered_instance_is_named_by_its_class_and_resumes(tmp_path):
    assert _Unregistered.name == "_Unregistered" and "_Unregistered" not in available_predictors()
    straight = HybridHFTrainer(
        model=tiny_gpt2(), args=hybrid_args(tmp_path, max_steps=30, save_strategy="steps", save_steps=18),
        train_dataset=tiny_data()[0], predictor=_Unregistered(),
    )  # fmt: skip
    straight.train()
    stats = straight.hybrid_stats()
    assert stats["predictor"] == "_Unregistered" and stats["steps_per_phase"]["predict"] > 0
    assert stats["no_predict_reason"] is None
    resumed = HybridHFTrainer(
        model=tiny_gpt2(), args=hybrid_args(tmp_path, max_steps=30), train_dataset=tiny_data()[0],
        predictor=_Unregistered(),
    )  # fmt: skip
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-18"))
    for name, value in resumed.model.named_parameters():
        assert torch.equal(value, dict(straight.model.named_parameters())[name]), name
    assert counters(resumed.hybrid_stats()) == counters(straight.hybrid_stats())


def test_registering_a_class_that_set_no_name_takes_the_registered_name():
    class Named(_Unregistered):
        pass

    hf_hybrid.register_predictor("named-later", Named)
    try:
        assert Named.name == "named-later" and "named-later" in available_predictors()
    finally:
        unregister_predictor("named-later")
