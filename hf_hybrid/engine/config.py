"""The engine's configuration, validated where it is built.

A bad value is refused in `__post_init__` with a `ConfigError` naming the field, so the engine is safe on
its own; `HybridTrainingArguments` re-raises it under its `hybrid_*` name (nothing is validated twice).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from .phases import PhaseSchedule, scripts_agree
from .validation import ConfigError, check_bool, check_choice, check_float, check_int

SNAPSHOT_DEVICES = ("same", "cpu")
GUARD_DEVICES = ("cpu", "same")
GUARD_STORAGES = ("host", "weights", "checkpoint", "none")
MAX_SEED = 2**63 - 1


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine's decisions depend on (the phase budgets live in `schedule`). `probe_cost`:
    forward units of one probe evaluation; `dormant_every`: FULL steps between dormant observations."""

    schedule: PhaseSchedule = field(default_factory=PhaseSchedule)
    predictor: str = "ema"
    predictor_kwargs: Mapping[str, Any] = field(default_factory=dict)
    check_every: int = 1
    max_delta: float = 0.05
    rollback: bool = True
    divergence_sigma: float = 3.0
    snapshot_device: str = "same"
    seed: int = 0
    use_bandit: bool = True
    probe_cost: float = 0.0
    dormant_every: int = 8

    def __post_init__(self) -> None:
        from .predictor import AUTO, available_predictors  # the registry is live: read it now

        if not isinstance(self.schedule, PhaseSchedule):
            raise ConfigError("schedule", self.schedule, "a PhaseSchedule")
        check_choice("predictor", self.predictor, [AUTO, *available_predictors()])
        if not isinstance(self.predictor_kwargs, Mapping) or not all(
            isinstance(k, str) for k in self.predictor_kwargs
        ):
            raise ConfigError(
                "predictor_kwargs", self.predictor_kwargs, "a mapping of argument names to values"
            )
        self._check_predictor_kwargs()
        check_int("check_every", self.check_every, 0)
        check_float("max_delta", self.max_delta, 0.0, 1.0, low_open=True)
        check_bool("rollback", self.rollback)
        check_float("divergence_sigma", self.divergence_sigma, 0.0, 1e6, low_open=True)
        check_choice("snapshot_device", self.snapshot_device, SNAPSHOT_DEVICES)
        check_int("seed", self.seed, 0, MAX_SEED)
        check_bool("use_bandit", self.use_bandit)
        check_float("probe_cost", self.probe_cost, 0.0, 1e6)
        check_int("dormant_every", self.dormant_every, 1, 1_000_000)

    def _check_predictor_kwargs(self) -> None:
        """Refuse a keyword the predictor does not take now, not as a TypeError later."""
        from .predictor import AUTO, AUTO_CANDIDATES, constructor_arguments

        for name in AUTO_CANDIDATES if self.predictor == AUTO else (self.predictor,):
            accepted = constructor_arguments(name)
            unknown = [] if accepted is None else sorted(set(self.predictor_kwargs) - set(accepted))
            if unknown:
                raise ConfigError(
                    "predictor_kwargs",
                    dict(self.predictor_kwargs),
                    f"keyword arguments of predictor {name!r}: {accepted or 'none'} (not {unknown})",
                )

    def fingerprint(self) -> dict[str, Any]:
        """JSON-able form; what must match for a saved engine state to mean anything to this one."""
        return {
            **asdict(self),
            "predictor_kwargs": dict(self.predictor_kwargs),
            "schedule": self.schedule.fingerprint(),
        }

    def describe_mismatch(self, saved: Mapping[str, Any], rename: Callable[[str], str] = str) -> str | None:
        """Why a state saved under `saved` (a fingerprint) cannot be used here (None: it can); fields named
        by `rename`."""
        now = _flat(self.fingerprint())
        before = _flat(dict(saved))
        if scripts_agree(before.get("script"), now.get("script")):
            before["script"] = now.get("script")
        diff = {rename(k): (before.get(k), v) for k, v in now.items() if before.get(k) != v}
        diff.update({rename(k): (v, None) for k, v in before.items() if k not in now})
        if not diff:
            return None
        return f"hybrid configuration differs from the checkpoint's (saved, now): {diff}"


def _flat(fingerprint: dict[str, Any]) -> dict[str, Any]:
    """The schedule's fields at the top level, beside the engine's."""
    schedule = fingerprint.pop("schedule", None) or {}
    return {**fingerprint, **schedule}


@dataclass(frozen=True)
class SpikeGuardConfig:
    """A spike: a loss over `max_z` noise units above the median of the last clean steps and at least
    `min_rise` of it above (`min_rise_after_spike` right after a spike), or a gradient norm over
    `max_grad_ratio` times the recent median. Medians over a window, not a running mean and variance: a
    fine-tune's steep early descent would inflate the spread and hide a real spike. Two rises: a
    classifier's clean batch losses are heavy-tailed (+39%), a fault's first step is not (+53-100%), its
    later ones may rise less (`benchmarks/spike_replay.py`).

    `patience`: firing steps blamed on the weights before a restore (and quiet steps that end it).
    `storage`: `host` (weights and optimizer state on `device`), `weights` (a restore resets the optimizer
    state), `checkpoint` (the caller's copies) or `none` (skips only). `every`: clean steps between copies
    (widened from bytes, never timings, so a resumed run copies alike). `max_update_ratio`: the update
    check's limit (`update_check.py`; 0: off), `host` storage only."""

    enabled: bool = True
    every: int = 10
    trust_after: int = 5
    max_restores: int = 3
    window: int = 200
    max_z: float = 6.0
    min_rise: float = 0.5
    min_rise_after_spike: float = 0.2
    max_grad_ratio: float = 100.0
    history: int = 50
    min_history: int = 20
    device: str = "cpu"
    patience: int = 2
    storage: str = "host"
    max_update_ratio: float = 10.0

    def __post_init__(self) -> None:
        check_bool("enabled", self.enabled)
        check_int("every", self.every, 1, 1_000_000)
        check_int("trust_after", self.trust_after, 1, 1_000_000)
        check_int("max_restores", self.max_restores, 0, 1_000_000)
        check_int("window", self.window, 1, 100_000_000)
        check_float("max_z", self.max_z, 0.0, 1e6, low_open=True)
        check_float("min_rise", self.min_rise, 0.0, 1e6)
        check_float("min_rise_after_spike", self.min_rise_after_spike, 0.0, 1e6)
        check_float("max_grad_ratio", self.max_grad_ratio, 1.0, 1e12, low_open=True)
        check_int("history", self.history, 2, 1_000_000)
        check_int("min_history", self.min_history, 2, self.history, "an integer in [2, `history`]")
        check_choice("device", self.device, GUARD_DEVICES)
        check_int("patience", self.patience, 1, 1_000_000)
        check_choice("storage", self.storage, GUARD_STORAGES)
        check_float("max_update_ratio", self.max_update_ratio, 0.0, 1e12)
