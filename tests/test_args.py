"""HybridTrainingArguments: parseable by HfArgumentParser, every bad field refused with a clear message."""

from __future__ import annotations

import dataclasses
import re

import pytest
from transformers import HfArgumentParser, TrainingArguments

from hf_hybrid import HybridArgumentsMixin, HybridHFTrainer, HybridTrainingArguments
from hf_hybrid.engine.predictor import PREDICTORS

BAD_VALUES = [
    ("hybrid_warmup_steps", -1, r"integer >= 0"),
    ("hybrid_warmup_steps", 1.5, r"integer >= 0"),
    ("hybrid_full_steps", -3, r"integer >= 0"),
    ("hybrid_min_predict_steps", 0, r"integer in \[1, 1024\]"),
    ("hybrid_max_predict_steps", 1, r"integer in \[2, 1024\]"),
    ("hybrid_max_predict_steps", 5000, r"integer in \[2, 1024\]"),
    ("hybrid_confidence_threshold", 1.5, r"number in \[0.0, 1.0\]"),
    ("hybrid_confidence_threshold", float("nan"), r"number in \[0.0, 1.0\]"),
    ("hybrid_correction_interval", -1, r"integer >= 0"),
    ("hybrid_predictor", "magic", r"one of \['auto', 'adam', 'ema', 'lowrank', 'null'\]"),
    ("hybrid_check_every", -2, r"integer >= 0"),
    ("hybrid_max_delta", 0.0, r"number in \(0.0, 1.0\]"),
    ("hybrid_max_delta", 2.0, r"number in \(0.0, 1.0\]"),
    ("hybrid_rollback", "yes", r"True or False"),
    ("hybrid_divergence_sigma", -1.0, r"number in \(0.0"),
    ("hybrid_snapshot_device", "gpu", r"one of \['same', 'cpu'\]"),
    ("hybrid_seed", -5, r"integer in \[0, "),
    ("hybrid_min_history", 0, r"integer >= 1"),
    ("hybrid_probe_batches", -1, r"integer in \[0, 1024\]"),
    ("hybrid_enabled", 1, r"True or False"),
    ("hybrid_restart_engine", "no", r"True or False"),
]


@pytest.mark.parametrize(("field", "value", "allowed"), BAD_VALUES)
def test_each_bad_field_is_refused_naming_field_value_and_range(tmp_path, field, value, allowed):
    with pytest.raises(
        ValueError, match=rf"`{field}` must be (an? )?{allowed}.*got {re.escape(repr(value))}"
    ):
        HybridTrainingArguments(output_dir=str(tmp_path), report_to="none", **{field: value})


def test_every_hybrid_field_has_a_validation_case():
    hybrid_fields = {f.name for f in dataclasses.fields(HybridArgumentsMixin)}
    assert hybrid_fields == {field for field, _, _ in BAD_VALUES} | {"hybrid_use_bandit"}


def test_bad_field_fails_before_any_model_is_touched(tmp_path):
    touched = []

    class Model:
        def __getattr__(self, name):
            touched.append(name)
            raise AttributeError(name)

    with pytest.raises(ValueError, match="hybrid_max_delta"):
        HybridHFTrainer(
            model=Model(),
            args=HybridTrainingArguments(output_dir=str(tmp_path), report_to="none", hybrid_max_delta=0),
        )
    assert touched == []


def test_hf_argument_parser_reads_every_field(tmp_path):
    parser = HfArgumentParser(HybridTrainingArguments)
    (args,) = parser.parse_args_into_dataclasses(
        [
            "--output_dir", str(tmp_path), "--report_to", "none",
            "--hybrid_warmup_steps", "7", "--hybrid_predictor", "lowrank", "--hybrid_max_delta", "0.02",
            "--hybrid_snapshot_device", "cpu", "--no_hybrid_rollback", "--hybrid_seed", "3",
            "--hybrid_enabled", "false",
        ]
    )  # fmt: skip
    assert isinstance(args, TrainingArguments)
    assert (args.hybrid_warmup_steps, args.hybrid_predictor, args.hybrid_max_delta) == (7, "lowrank", 0.02)
    assert (args.hybrid_snapshot_device, args.hybrid_rollback, args.hybrid_seed) == ("cpu", False, 3)
    assert args.hybrid_enabled is False


def test_parser_rejects_a_predictor_outside_the_registry(tmp_path, capsys):
    parser = HfArgumentParser(HybridTrainingArguments)
    with pytest.raises(SystemExit):
        parser.parse_args_into_dataclasses(["--output_dir", str(tmp_path), "--hybrid_predictor", "magic"])
    assert "invalid choice" in capsys.readouterr().err
    assert sorted(PREDICTORS) == ["adam", "ema", "lowrank", "null"]


def test_engine_config_takes_the_training_seed_by_default(tmp_path):
    args = HybridTrainingArguments(output_dir=str(tmp_path), report_to="none", seed=11)
    assert args.engine_config().seed == 11
    args = HybridTrainingArguments(output_dir=str(tmp_path), report_to="none", seed=11, hybrid_seed=4)
    assert args.engine_config().seed == 4
