"""What the engine did, counted: steps per phase, backward passes run and skipped, rollbacks, refusals,
and the compute they cost in forward-pass units by a *nominal* cost model.

The nominal model (forward 1, backward 2) is the textbook rule for large models, the same on every
machine; not a measurement (on a small CPU model a backward costs ~0.64 of a forward). The arena prices
every kind of step by timing it on the task instead (`hf_hybrid/bench/calibration.py`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from .phases import Phase

# Nominal cost of one step in forward-pass units (forward 1, backward 2; see the module docstring).
NOMINAL_STEP_COST = 3.0
NOMINAL_CHECKED_PREDICT_COST = 1.0

EVENTS = (
    "backward_run",
    "backward_skipped",
    "predict_checked",
    "predict_blind",
    "predict_phases",
    "rollbacks",
    "forced_full",
    "refused_updates",
    "predictor_errors",
    "nonfinite_real_steps",
    "skipped_updates",
    "clipped_tensors",
    "probe_evaluations",
)


class StepCounters:
    """Integer counters keyed by event name (`EVENTS`) and by `steps_<phase>`."""

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()

    def add(self, key: str, amount: int = 1) -> None:
        self._counts[key] += amount

    def __getitem__(self, key: str) -> int:
        return self._counts[key]

    def steps_per_phase(self) -> dict[str, int]:
        return {p.value: self._counts[f"steps_{p.value}"] for p in Phase}

    def compute_units(self, probe_cost: float) -> float:
        """Nominal forward units spent: 3 a real step, 1 a checked predicted step, the probe's forwards."""
        return (
            self._counts["backward_run"] * NOMINAL_STEP_COST
            + self._counts["predict_checked"] * NOMINAL_CHECKED_PREDICT_COST
            + self._counts["probe_evaluations"] * probe_cost
        )

    def summary(self, probe_cost: float) -> dict[str, Any]:
        steps = self.steps_per_phase()
        run, skipped = self._counts["backward_run"], self._counts["backward_skipped"]
        cost = self.compute_units(probe_cost)
        return {
            "steps": sum(steps.values()),
            "steps_per_phase": steps,
            **{key: self._counts[key] for key in EVENTS},
            "backward_skipped_fraction": skipped / max(run + skipped, 1),
            "compute_units": cost,
            "compute_saved_fraction": 1.0 - cost / max((run + skipped) * NOMINAL_STEP_COST, 1.0),
        }

    def state_dict(self) -> dict[str, int]:
        return dict(self._counts)

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        self._counts = Counter({key: int(value) for key, value in state.items()})
