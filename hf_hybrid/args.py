"""HybridTrainingArguments: `TrainingArguments` plus the `hybrid_*` fields.

The fields live in a mixin so any `TrainingArguments` subclass (TRL's `SFTConfig`, say) can carry
them: `@dataclass class HybridSFTConfig(HybridArgumentsMixin, SFTConfig): pass`.
Every field is checked in `__post_init__`, before a model is loaded or a step is spent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

from transformers import TrainingArguments

from .engine.engine import EngineConfig
from .engine.phases import PhaseSchedule
from .engine.predictor import AUTO, PREDICTORS

SNAPSHOT_DEVICES = ("same", "cpu")


@dataclass
class HybridArgumentsMixin:
    """The hybrid fields; see each field's help."""

    hybrid_enabled: bool = field(
        default=True,
        metadata={
            "help": "Route optimizer steps through the phase machine. False: exactly the plain Trainer."
        },
    )
    hybrid_warmup_steps: int = field(
        default=100,
        metadata={"help": "Ordinary steps at the start during which the predictors only observe (>= 0)."},
    )
    hybrid_full_steps: int = field(
        default=20,
        metadata={"help": "Real steps between two predict phases (>= 0)."},
    )
    hybrid_min_predict_steps: int = field(
        default=2, metadata={"help": "Shortest predict horizon (>= 1, <= hybrid_max_predict_steps)."}
    )
    hybrid_max_predict_steps: int = field(
        default=16, metadata={"help": "Longest predict horizon (>= hybrid_min_predict_steps, <= 1024)."}
    )
    hybrid_confidence_threshold: float = field(
        default=0.85,
        metadata={
            "help": "Measured confidence (mean recent skill of the predicted updates, in [0, 1]) needed to "
            "enter a predict phase. 0 predicts whenever the schedule allows."
        },
    )
    hybrid_correction_interval: int = field(
        default=0,
        metadata={"help": "Insert a real CORRECT step after this many predicted steps (0: only at the end)."},
    )
    hybrid_predictor: str = field(
        default="ema",
        metadata={
            "help": "Weight-delta predictor. auto: `adam` (replays torch Adam/AdamW, no extra buffer) "
            "when the optimizer allows, else `ema`: 1x instead of 2x the trainable bytes, but slower on "
            "large models (see benchmarks/README.md).",
            "choices": [AUTO, *sorted(PREDICTORS)],
        },
    )
    hybrid_check_every: int = field(
        default=1,
        metadata={
            "help": "Measure the loss (forward pass) on every n-th predicted step (1: all; 0: none, blind)."
        },
    )
    hybrid_max_delta: float = field(
        default=0.05,
        metadata={"help": "Trust region: largest predicted change relative to the weight, in (0, 1]."},
    )
    hybrid_rollback: bool = field(
        default=True, metadata={"help": "Roll back a predict phase whose loss regressed or diverged."}
    )
    hybrid_divergence_sigma: float = field(
        default=3.0, metadata={"help": "Loss z-score that counts as divergence (> 0)."}
    )
    hybrid_snapshot_device: str = field(
        default="same",
        metadata={"help": "Where the rollback snapshot lives.", "choices": list(SNAPSHOT_DEVICES)},
    )
    hybrid_seed: int | None = field(
        default=None, metadata={"help": "Seed of the engine's own generators (default: `seed`)."}
    )
    hybrid_min_history: int = field(
        default=8,
        metadata={"help": "Real updates the predictor must have seen before a predict phase (>= 1)."},
    )
    hybrid_use_bandit: bool = field(
        default=True,
        metadata={"help": "Choose the horizon with a UCB1 bandit; False always uses the largest allowed."},
    )

    hybrid_probe_batches: int = field(
        default=0,
        metadata={
            "help": "Validate each predict phase on this many fixed training-sized batches (eval mode, "
            "no_grad): it is kept only if their loss fell from the phase's start to its end (0: off, the "
            "noisier training-loss regression test decides)."
        },
    )
    hybrid_restart_engine: bool = field(
        default=False,
        metadata={
            "help": "On resume, ignore the saved hybrid state and start the engine fresh (needed after "
            "changing the hybrid configuration or the trainable parameters)."
        },
    )

    def __post_init__(self) -> None:
        self.validate_hybrid_args()
        super().__post_init__()  # type: ignore[misc]

    def validate_hybrid_args(self) -> None:
        """Raise a ValueError naming the field, its value and what is allowed."""
        _check_int(self, "hybrid_warmup_steps", 0)
        _check_int(self, "hybrid_full_steps", 0)
        _check_int(self, "hybrid_min_predict_steps", 1, 1024)
        _check_int(self, "hybrid_max_predict_steps", self.hybrid_min_predict_steps, 1024)
        _check_int(self, "hybrid_correction_interval", 0)
        _check_int(self, "hybrid_check_every", 0)
        _check_int(self, "hybrid_min_history", 1)
        _check_int(self, "hybrid_probe_batches", 0, 1024)
        _check_float(self, "hybrid_confidence_threshold", 0.0, 1.0)
        _check_float(self, "hybrid_max_delta", 0.0, 1.0, low_open=True)
        _check_float(self, "hybrid_divergence_sigma", 0.0, 1e6, low_open=True)
        if self.hybrid_predictor not in (AUTO, *PREDICTORS):
            allowed = [AUTO, *sorted(PREDICTORS)]
            raise ValueError(f"`hybrid_predictor` must be one of {allowed}, got {self.hybrid_predictor!r}")
        if self.hybrid_snapshot_device not in SNAPSHOT_DEVICES:
            raise ValueError(
                f"`hybrid_snapshot_device` must be one of {list(SNAPSHOT_DEVICES)}, "
                f"got {self.hybrid_snapshot_device!r}"
            )
        if self.hybrid_seed is not None:
            _check_int(self, "hybrid_seed", 0, 2**63 - 1)
        for name in ("hybrid_enabled", "hybrid_rollback", "hybrid_use_bandit", "hybrid_restart_engine"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"`{name}` must be True or False, got {getattr(self, name)!r}")

    def engine_config(self) -> EngineConfig:
        """The engine's view of these arguments."""
        seed = self.hybrid_seed if self.hybrid_seed is not None else getattr(self, "seed", 0)
        return EngineConfig(
            schedule=PhaseSchedule(
                warmup_steps=self.hybrid_warmup_steps,
                full_steps=self.hybrid_full_steps,
                min_predict_steps=self.hybrid_min_predict_steps,
                max_predict_steps=self.hybrid_max_predict_steps,
                confidence_threshold=self.hybrid_confidence_threshold,
                correction_interval=self.hybrid_correction_interval,
                min_history=self.hybrid_min_history,
            ),
            predictor=self.hybrid_predictor,
            check_every=self.hybrid_check_every,
            max_delta=self.hybrid_max_delta,
            rollback=self.hybrid_rollback,
            divergence_sigma=self.hybrid_divergence_sigma,
            snapshot_device=self.hybrid_snapshot_device,
            seed=seed,
            use_bandit=self.hybrid_use_bandit,
            probe_cost=self._probe_cost(),
        )

    def _probe_cost(self) -> float:
        """Forward units of one probe evaluation: its batches are training-sized, a step has GA of them."""
        return self.hybrid_probe_batches / getattr(self, "gradient_accumulation_steps", 1)

    def hybrid_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(HybridArgumentsMixin)}


@dataclass
class HybridTrainingArguments(HybridArgumentsMixin, TrainingArguments):
    """`TrainingArguments` with the hybrid fields; parseable by `HfArgumentParser`."""


def upcast_training_args(args: TrainingArguments | None) -> TrainingArguments:
    """Upcast a plain `TrainingArguments` to `HybridTrainingArguments` with hybrid defaults (as TRL does)."""
    if args is None:
        return HybridTrainingArguments(output_dir="trainer_output")
    if isinstance(args, HybridArgumentsMixin):
        return args
    values = args.to_dict()
    values["hub_token"] = args.hub_token  # to_dict() masks tokens
    return HybridTrainingArguments(**values)


def _check_int(obj: Any, name: str, low: int, high: int | None = None) -> None:
    value = getattr(obj, name)
    allowed = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < low
        or (high is not None and value > high)
    ):
        raise ValueError(f"`{name}` must be {allowed}, got {value!r}")


def _check_float(obj: Any, name: str, low: float, high: float, low_open: bool = False) -> None:
    value = getattr(obj, name)
    bracket = "(" if low_open else "["
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low) and value <= high
    if not ok:
        raise ValueError(f"`{name}` must be a number in {bracket}{low}, {high}], got {value!r}")
