"""The phase state machine: which kind of optimizer step comes next.

WARMUP -> FULL -> PREDICT -> CORRECT -> FULL ... It only counts and decides, from scalars identical on
every rank, so every rank takes the same decision without communicating.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any

from .validation import ConfigError, check_float, check_int

MAX_HORIZON = 1024  # longest predict phase the controller accepts


class Phase(str, Enum):
    """Kind of one optimizer step."""

    WARMUP = "warmup"
    FULL = "full"
    PREDICT = "predict"
    CORRECT = "correct"

    @property
    def index(self) -> int:
        return list(Phase).index(self)

    @property
    def runs_backward(self) -> bool:
        return self is not Phase.PREDICT


@dataclass(frozen=True)
class PhaseSchedule:
    """Budgets of the cycle, validated here (see `validation.ConfigError`)."""

    warmup_steps: int = 100
    full_steps: int = 20
    min_predict_steps: int = 2
    max_predict_steps: int = 16
    confidence_threshold: float = 0.85
    correction_interval: int = 0
    min_history: int = 8
    script: tuple[Phase, ...] | None = None  # replay a recorded phase sequence (the benchmark's controls)

    def fingerprint(self) -> dict[str, Any]:
        """JSON-able form (a script is stored as its phase names)."""
        values = asdict(self)
        if self.script is not None:
            values["script"] = [p.value for p in self.script]
        return values

    def __post_init__(self) -> None:
        for name in ("warmup_steps", "full_steps", "correction_interval"):
            check_int(name, getattr(self, name), 0)
        check_int("min_history", self.min_history, 1)
        check_int("min_predict_steps", self.min_predict_steps, 1, MAX_HORIZON)
        low = self.min_predict_steps if isinstance(self.min_predict_steps, int) else 1
        check_int(
            "max_predict_steps",
            self.max_predict_steps,
            low,
            MAX_HORIZON,
            bounds=f"an integer in [{low}, {MAX_HORIZON}] (at least `min_predict_steps`, which is {low})",
        )
        check_float("confidence_threshold", self.confidence_threshold, 0.0, 1.0)
        if self.script is not None and not all(isinstance(p, Phase) for p in self.script):
            raise ConfigError("script", self.script, "None or a sequence of Phase values")


def scripts_agree(saved: Any, now: Any) -> bool:
    """Replayed phase scripts a run can resume across: they agree wherever both are defined (the arena's
    trunk segments and branches)."""
    if isinstance(saved, list) and isinstance(now, list):
        common = min(len(saved), len(now))
        return saved[:common] == now[:common]
    return saved == now


def same_schedule(saved: dict[str, Any], now: dict[str, Any]) -> bool:
    """Schedule fingerprints a run can resume across: equal but for scripts that agree."""
    saved, now = dict(saved), dict(now)
    return scripts_agree(saved.pop("script", None), now.pop("script", None)) and saved == now


class PhaseController:
    """Decides the phase of each optimizer step: PREDICT only after warmup, `full_steps` real steps since
    the last phase, `min_history` updates and the confidence threshold, for `horizon` steps closed by a
    CORRECT one. With `schedule.script` the phases are replayed (a control run's)."""

    def __init__(self, schedule: PhaseSchedule) -> None:
        self.schedule = schedule
        self.steps_decided = 0
        self.phase: Phase | None = None
        self.full_remaining = 0
        self.predict_remaining = 0
        self.predicted_since_correct = 0
        self.forced_full_remaining = 0
        self.horizon = 0
        self.horizon_cap = schedule.max_predict_steps

    @property
    def in_predict_phase(self) -> bool:
        """True from the first PREDICT step until the CORRECT step that closes the phase."""
        return self.phase is Phase.PREDICT or (self.phase is Phase.CORRECT and self.predict_remaining > 0)

    def decide(self, confidence: float, history: int, choose_horizon: Callable[[int], int]) -> Phase:
        """Phase of the next optimizer step; `choose_horizon(cap)` is asked only when a phase opens."""
        phase = self._next_phase(confidence, history, choose_horizon)
        self.phase = phase
        self.steps_decided += 1
        return phase

    def _next_phase(self, confidence: float, history: int, choose_horizon: Callable[[int], int]) -> Phase:
        s = self.schedule
        if s.script is not None:
            return self._scripted()
        if self.steps_decided < s.warmup_steps:
            return Phase.WARMUP
        if self.phase is Phase.WARMUP:
            self.full_remaining = s.full_steps
        if self.forced_full_remaining > 0:
            self.forced_full_remaining -= 1
            return Phase.FULL
        if self.phase is Phase.PREDICT:
            interval_done = (
                s.correction_interval > 0 and self.predicted_since_correct >= s.correction_interval
            )
            if self.predict_remaining == 0 or interval_done:
                self.predicted_since_correct = 0
                return Phase.CORRECT
            return self._predict()
        if self.phase is Phase.CORRECT and self.predict_remaining > 0:
            return self._predict()
        if self.phase is Phase.CORRECT:
            self.full_remaining = s.full_steps
        if self.full_remaining > 0:
            self.full_remaining -= 1
            return Phase.FULL
        if history >= s.min_history and confidence >= s.confidence_threshold:
            horizon = int(choose_horizon(self.horizon_cap))
            self.horizon = max(s.min_predict_steps, min(horizon, self.horizon_cap))
            self.predict_remaining = self.horizon
            return self._predict()
        return Phase.FULL

    def _scripted(self) -> Phase:
        script = self.schedule.script
        index = self.steps_decided
        phase = script[index] if index < len(script) else Phase.FULL
        if phase in (Phase.PREDICT, Phase.CORRECT):
            rest = script[index + 1 :]
            end = next((i for i, p in enumerate(rest) if p not in (Phase.PREDICT, Phase.CORRECT)), len(rest))
            self.predict_remaining = sum(p is Phase.PREDICT for p in rest[:end])
            if phase is Phase.PREDICT and not self.in_predict_phase:
                self.horizon = 1 + self.predict_remaining
            self.predicted_since_correct = self.predicted_since_correct + 1 if phase is Phase.PREDICT else 0
        return phase

    def _predict(self) -> Phase:
        self.predict_remaining -= 1
        self.predicted_since_correct += 1
        return Phase.PREDICT

    def force_full(self, steps: int) -> None:
        """Escape hatch: the next `steps` steps are FULL; an open predict phase is abandoned."""
        if steps < 0:
            raise ValueError(f"`steps` must be >= 0, got {steps}")
        self.forced_full_remaining = max(self.forced_full_remaining, steps)
        self.predict_remaining = 0
        self.predicted_since_correct = 0
        if self.phase in (Phase.PREDICT, Phase.CORRECT):
            self.phase = Phase.FULL  # the forced steps are this cycle's FULL budget, not added to it
            self.full_remaining = 0

    def end_phase(self, failed: bool, widen: bool = True) -> None:
        """The predict phase closed: a failed one halves the cap on later horizons, a validated one lets
        it grow back (unless `widen` is False)."""
        self.predict_remaining = 0
        self.predicted_since_correct = 0
        if failed:
            self.horizon_cap = max(self.schedule.min_predict_steps, self.horizon_cap // 2)
        elif widen:
            self.relax()

    def shorten(self) -> None:
        """Halve the rest of an open predict phase and the cap on later horizons."""
        self.predict_remaining //= 2
        self.horizon_cap = max(self.schedule.min_predict_steps, self.horizon_cap // 2)

    def relax(self) -> None:
        """After a phase that went well, let the cap grow back towards the maximum."""
        self.horizon_cap = min(self.schedule.max_predict_steps, self.horizon_cap * 2)

    def warmup_steps_left(self) -> int | None:
        """Steps until the warmup ends (None: a scripted controller, whose phases are replayed)."""
        if self.schedule.script is not None:
            return None
        return max(0, self.schedule.warmup_steps - self.steps_decided)

    def metrics(self) -> dict[str, float]:
        """The current phase (its code, `Phase.index`; 0 before the first step) and horizons."""
        return {
            "phase": float(self.phase.index if self.phase else 0),
            "horizon": float(self.horizon),
            "horizon_cap": float(self.horizon_cap),
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "schedule": self.schedule.fingerprint(),
            "steps_decided": self.steps_decided,
            "phase": None if self.phase is None else self.phase.value,
            **{key: getattr(self, key) for key in _COUNTERS},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not same_schedule(state["schedule"], self.schedule.fingerprint()):
            raise ValueError(
                f"phase schedule differs: saved {state['schedule']}, configured {self.schedule.fingerprint()}"
            )
        self.steps_decided = int(state["steps_decided"])
        self.phase = None if state["phase"] is None else Phase(state["phase"])
        for key in _COUNTERS:
            setattr(self, key, int(state[key]))


# the controller's counters, saved and restored as they are
_COUNTERS = (
    "full_remaining",
    "predict_remaining",
    "predicted_since_correct",
    "forced_full_remaining",
    "horizon",
    "horizon_cap",
)
