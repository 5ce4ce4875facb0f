"""EngineConfig and PhaseSchedule refuse every bad value themselves: the engine is safe without the
HF arguments in front of it."""

from __future__ import annotations

import re

import pytest

from hf_hybrid.engine.config import EngineConfig
from hf_hybrid.engine.phases import Phase, PhaseSchedule
from hf_hybrid.engine.validation import ConfigError

ENGINE_BAD = [
    ("max_delta", -1.0, r"a number in \(0.0, 1.0\]"),
    ("max_delta", 0.0, r"a number in \(0.0, 1.0\]"),
    ("max_delta", float("inf"), r"a number in \(0.0, 1.0\]"),
    ("check_every", -3, r"an integer >= 0"),
    ("check_every", 1.5, r"an integer >= 0"),
    ("dormant_every", -1, r"an integer in \[1, 1000000\]"),
    ("dormant_every", 0, r"an integer in \[1, 1000000\]"),
    ("probe_cost", -5, r"a number in \[0.0, 1000000.0\]"),
    ("divergence_sigma", 0.0, r"a number in \(0.0, 1000000.0\]"),
    ("snapshot_device", "gpu", r"one of \['same', 'cpu'\]"),
    ("seed", -1, r"an integer in \[0, 9223372036854775807\]"),
    ("rollback", "yes", r"True or False"),
    ("use_bandit", 1, r"True or False"),
    ("predictor", "magic", r"one of \['auto', 'adam', 'ema', 'null'\]"),
    ("predictor_kwargs", ["beta"], r"a mapping of argument names to values"),
]
SCHEDULE_BAD = [
    ("warmup_steps", -1, r"an integer >= 0"),
    ("full_steps", -2, r"an integer >= 0"),
    ("correction_interval", -1, r"an integer >= 0"),
    ("min_history", 0, r"an integer >= 1"),
    ("min_predict_steps", 0, r"an integer in \[1, 1024\]"),
    ("max_predict_steps", 2000, r"an integer in \[2, 1024\] \(at least `min_predict_steps`, which is 2\)"),
    ("confidence_threshold", 1.5, r"a number in \[0.0, 1.0\]"),
    ("confidence_threshold", float("nan"), r"a number in \[0.0, 1.0\]"),
    ("script", ("full",), r"None or a sequence of Phase values"),
]


@pytest.mark.parametrize(("name", "value", "allowed"), ENGINE_BAD)
def test_engine_config_refuses_bad_values(name, value, allowed) -> None:
    with pytest.raises(
        ConfigError, match=rf"^`{name}` must be {allowed}, got {re.escape(repr(value))}$"
    ) as info:
        EngineConfig(**{name: value})
    assert (info.value.name, info.value.value) == (name, value)


@pytest.mark.parametrize(("name", "value", "allowed"), SCHEDULE_BAD)
def test_phase_schedule_refuses_bad_values(name, value, allowed) -> None:
    with pytest.raises(ConfigError, match=rf"^`{name}` must be {allowed}, got {re.escape(repr(value))}$"):
        PhaseSchedule(**{name: value})


def test_an_inverted_horizon_range_names_both_fields() -> None:
    with pytest.raises(ConfigError) as info:
        PhaseSchedule(min_predict_steps=8, max_predict_steps=4)
    assert str(info.value) == (
        "`max_predict_steps` must be an integer in [8, 1024] "
        "(at least `min_predict_steps`, which is 8), got 4"
    )
    renamed = info.value.message(lambda name: f"hybrid_{name}")
    assert renamed == (
        "`hybrid_max_predict_steps` must be an integer in [8, 1024] "
        "(at least `hybrid_min_predict_steps`, which is 8), got 4"
    )


def test_every_engine_field_has_a_refusal_case() -> None:
    import dataclasses

    engine = {f.name for f in dataclasses.fields(EngineConfig)} - {"schedule"}
    schedule = {f.name for f in dataclasses.fields(PhaseSchedule)}
    assert engine == {name for name, _, _ in ENGINE_BAD}
    assert schedule == {name for name, _, _ in SCHEDULE_BAD}


def test_good_values_build_and_fingerprint_is_json_able() -> None:
    import json

    config = EngineConfig(
        schedule=PhaseSchedule(script=(Phase.FULL, Phase.PREDICT)),
        predictor_kwargs={"beta": 0.5},
        dormant_every=1,
    )
    fingerprint = json.loads(json.dumps(config.fingerprint()))
    assert fingerprint["schedule"]["script"] == ["full", "predict"]
    assert config.describe_mismatch(fingerprint) is None
    changed = {**fingerprint, "check_every": 5, "schedule": {**fingerprint["schedule"], "warmup_steps": 7}}
    message = config.describe_mismatch(changed, rename=lambda name: f"hybrid_{name}")
    assert "'hybrid_check_every': (5, 1)" in message and "'hybrid_warmup_steps': (7, 100)" in message
