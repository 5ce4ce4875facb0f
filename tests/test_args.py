"""HybridTrainingArguments: parseable by HfArgumentParser, every bad field refused with a clear message."""

from __future__ import annotations

import dataclasses
import re

import pytest
from transformers import HfArgumentParser, TrainingArguments

from hf_hybrid import HybridArgumentsMixin, HybridHFTrainer, HybridTrainingArguments
from hf_hybrid.engine.config import EngineConfig
from hf_hybrid.engine.phases import PhaseSchedule
from hf_hybrid.engine.predictor import (
    EMAPredictor,
    available_predictors,
    register_predictor,
    unregister_predictor,
)
from hf_hybrid.hybrid_arguments import engine_target

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
    ("hybrid_predictor", "magic", r"one of \['auto', 'adam', 'ema', 'null'\]"),
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
    ("hybrid_use_bandit", "no", r"True or False"),
    ("hybrid_restart_engine", "no", r"True or False"),
    ("hybrid_dormant_every", 0, r"integer in \[1, 1000000\]"),
    ("hybrid_console_metrics", "verbose", r"one of \['compact', 'full'\]"),
    ("hybrid_spike_guard", "yes", r"one of \['auto', 'on', 'off'\]"),
    ("hybrid_guard_every", 0, r"an integer in \[1, 1000000\]"),
    ("hybrid_guard_spacing_mb", -1.0, r"a number in \[0.0, "),
    ("hybrid_guard_max_update_ratio", -1.0, r"a number in \[0.0, "),
    ("hybrid_guard_max_restores", -1, r"an integer in \[0, 1000000\]"),
    ("hybrid_guard_device", "gpu", r"one of \['cpu', 'same'\]"),
    ("hybrid_guard_storage", "disk", r"one of \['auto', 'host', 'weights', 'checkpoint', 'none'\]"),
    ("hybrid_guard_memory_mb", -1.0, r"number in \[0.0, "),
    ("hybrid_predictor_kwargs", "[1, 2]", r"a JSON object"),
    ("hybrid_predictor_kwargs", "{beta: 1}", r"a JSON object \(Expecting property name"),
    (
        "hybrid_predictor_kwargs",
        {"betta": 0.8},
        r"keyword arguments of predictor 'ema': \['beta', 'decay'\] \(not \['betta'\]\)",
    ),
]


@pytest.mark.parametrize(("field", "value", "allowed"), BAD_VALUES)
def test_each_bad_field_is_refused_naming_field_value_and_range(tmp_path, field, value, allowed):
    with pytest.raises(
        ValueError, match=rf"`{field}` must be (an? )?{allowed}.*got {re.escape(repr(value))}"
    ):
        HybridTrainingArguments(output_dir=str(tmp_path), report_to="none", **{field: value})


def test_every_hybrid_field_has_a_validation_case():
    hybrid_fields = {f.name for f in dataclasses.fields(HybridArgumentsMixin)}
    assert hybrid_fields == {field for field, _, _ in BAD_VALUES}


def test_messages_name_every_field_involved(tmp_path):
    with pytest.raises(
        ValueError,
        match=r"^`hybrid_max_predict_steps` must be an integer in \[8, 1024\] "
        r"\(at least `hybrid_min_predict_steps`, which is 8\), got 4$",
    ):
        HybridTrainingArguments(
            output_dir=str(tmp_path), report_to="none", hybrid_min_predict_steps=8, hybrid_max_predict_steps=4
        )


def test_a_predictor_kwargs_mapping_is_passed_on_as_it_is(tmp_path):
    """The keys are checked against the predictor's constructor; the values are the constructor's to
    judge when the engine builds it."""
    args = HybridTrainingArguments(
        output_dir=str(tmp_path),
        report_to="none",
        hybrid_predictor="ema",
        hybrid_predictor_kwargs={"beta": [1]},
    )
    assert args.hybrid_predictor_kwargs == {"beta": [1]}
    assert args.engine_config().predictor_kwargs == {"beta": [1]}


def test_predictor_kwargs_are_checked_against_the_constructor_when_the_arguments_are_parsed(tmp_path):
    """Issue 24, item 3: `--hybrid_predictor_kwargs '{"betta": 0.8}'` failed at train start with a raw
    TypeError; it is refused when the arguments are built, naming the key and the accepted ones. With
    `auto` every predictor it may become must take the key; a constructor with **kwargs takes any."""
    parser = HfArgumentParser(HybridTrainingArguments)
    with pytest.raises(ValueError, match=r"predictor 'ema': \['beta', 'decay'\] \(not \['betta'\]\)"):
        parser.parse_args_into_dataclasses(
            ["--output_dir", str(tmp_path), "--hybrid_predictor_kwargs", '{"betta": 0.8}']
        )
    with pytest.raises(ValueError, match=r"predictor 'adam': none \(not \['beta'\]\)"):
        HybridTrainingArguments(
            output_dir=str(tmp_path), hybrid_predictor="auto", hybrid_predictor_kwargs={"beta": 0.8}
        )

    class Open(EMAPredictor):
        def __init__(self, **kwargs):
            super().__init__()

    register_predictor("open-kwargs", Open)
    try:
        args = HybridTrainingArguments(
            output_dir=str(tmp_path), hybrid_predictor="open-kwargs", hybrid_predictor_kwargs={"anything": 1}
        )
        assert args.engine_config().predictor_kwargs == {"anything": 1}
    finally:
        unregister_predictor("open-kwargs")


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
            "--hybrid_warmup_steps", "7", "--hybrid_predictor", "null", "--hybrid_max_delta", "0.02",
            "--hybrid_snapshot_device", "cpu", "--no_hybrid_rollback", "--hybrid_seed", "3",
            "--hybrid_enabled", "false",
        ]
    )  # fmt: skip
    assert isinstance(args, TrainingArguments)
    assert (args.hybrid_warmup_steps, args.hybrid_predictor, args.hybrid_max_delta) == (7, "null", 0.02)
    assert (args.hybrid_snapshot_device, args.hybrid_rollback, args.hybrid_seed) == ("cpu", False, 3)
    assert args.hybrid_enabled is False


def test_parser_rejects_a_predictor_outside_the_registry(tmp_path):
    parser = HfArgumentParser(HybridTrainingArguments)
    with pytest.raises(
        ValueError, match=r"`hybrid_predictor` must be one of \['auto', 'adam', .*got 'magic'"
    ):
        parser.parse_args_into_dataclasses(["--output_dir", str(tmp_path), "--hybrid_predictor", "magic"])
    assert available_predictors() == ["adam", "ema", "null"]


class _DampedEMA(EMAPredictor):
    """A user's predictor, registered after hf_hybrid was imported."""


def test_a_predictor_registered_after_import_is_parsed_and_used(tmp_path):
    from helpers import hybrid_trainer

    register_predictor("user-damped-ema", _DampedEMA)
    try:
        parser = HfArgumentParser(HybridTrainingArguments)
        (args,) = parser.parse_args_into_dataclasses(
            ["--output_dir", str(tmp_path), "--hybrid_predictor", "user-damped-ema",
             "--hybrid_predictor_kwargs", '{"beta": 0.5, "decay": 0.8}', "--hybrid_dormant_every", "4"]
        )  # fmt: skip
        assert args.hybrid_predictor_kwargs == {"beta": 0.5, "decay": 0.8}
        assert args.engine_config().dormant_every == 4
        trainer = hybrid_trainer(
            tmp_path,
            max_steps=20,
            hybrid_predictor="user-damped-ema",
            hybrid_predictor_kwargs='{"beta": 0.5}',
        )
        trainer.train()
    finally:
        unregister_predictor("user-damped-ema")
    assert type(trainer.engine.predictor) is _DampedEMA and trainer.engine.predictor.beta == 0.5
    assert trainer.hybrid_stats()["predictor"] == "user-damped-ema"
    assert trainer.hybrid_stats()["steps_per_phase"]["predict"] > 0


def test_every_hybrid_default_is_the_engine_default():
    """Defaults are written once, in EngineConfig/PhaseSchedule; the arguments read them from there."""
    engine, schedule = EngineConfig(), PhaseSchedule()
    mapped = {f.name for f in dataclasses.fields(HybridArgumentsMixin) if engine_target(f.name)}
    assert {f.name for f in dataclasses.fields(HybridArgumentsMixin)} - mapped == {
        "hybrid_enabled", "hybrid_probe_batches", "hybrid_restart_engine", "hybrid_console_metrics",
        "hybrid_spike_guard", "hybrid_guard_every", "hybrid_guard_spacing_mb",
        "hybrid_guard_max_update_ratio", "hybrid_guard_max_restores",
        "hybrid_guard_device",
        "hybrid_guard_storage", "hybrid_guard_memory_mb",
    }  # fmt: skip
    engine_knobs = {f.name for f in dataclasses.fields(EngineConfig)} - {"schedule", "probe_cost"}
    schedule_knobs = {f.name for f in dataclasses.fields(PhaseSchedule)} - {"script"}
    assert {name.removeprefix("hybrid_") for name in mapped} == engine_knobs | schedule_knobs  # all reachable
    for f in dataclasses.fields(HybridArgumentsMixin):
        if f.name in mapped and f.default is not None:  # None: derived (the training seed, no kwargs)
            owner, name = engine_target(f.name)
            assert f.default == getattr(schedule if owner == "schedule" else engine, name), f.name


def test_engine_config_takes_the_training_seed_by_default(tmp_path):
    args = HybridTrainingArguments(output_dir=str(tmp_path), report_to="none", seed=11)
    assert args.engine_config().seed == 11
    args = HybridTrainingArguments(output_dir=str(tmp_path), report_to="none", seed=11, hybrid_seed=4)
    assert args.engine_config().seed == 4
