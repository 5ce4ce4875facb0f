"""The `hybrid_*` fields, as a dataclass mixin any `TrainingArguments` subclass can carry.

Defaults and validation are the engine's own (`EngineConfig`/`PhaseSchedule`), a bad value refused
under its `hybrid_*` name in `__post_init__`. Imports neither transformers nor torch (a fast CLI).
"""

from __future__ import annotations

import json
from dataclasses import Field, dataclass, field, fields
from typing import Any

from .engine.config import GUARD_DEVICES, GUARD_STORAGES, EngineConfig, SpikeGuardConfig
from .engine.phases import PhaseSchedule
from .engine.validation import ConfigError, check_bool, check_choice, check_float, check_int

PREFIX = "hybrid_"
CONSOLE_METRICS = ("compact", "full")
SPIKE_GUARD_MODES = ("auto", "on", "off")
GUARD_STORAGE_CHOICES = ("auto", *GUARD_STORAGES)
_GUARD_DEFAULTS = SpikeGuardConfig()


def engine_target(hybrid_name: str) -> tuple[str, str] | None:
    """Where `hybrid_<name>` goes: ("schedule" | "engine", name), None for the trainer's own fields."""
    name = hybrid_name.removeprefix(PREFIX)
    for owner, source in (("schedule", PhaseSchedule), ("engine", EngineConfig)):
        if name in {f.name for f in fields(source)} and name != "schedule":
            return owner, name
    return None


def help_field(default: Any, help: str, **metadata: Any) -> Any:
    """A dataclass field with its `--help` text (and `choices`), as HfArgumentParser and the short help
    read them."""
    return field(default=default, metadata={"help": help, **metadata})


def _engine_field(name: str, help: str) -> Any:
    """A field whose default is the engine's own: `name` of PhaseSchedule or EngineConfig."""
    source = PhaseSchedule if name in {f.name for f in fields(PhaseSchedule)} else EngineConfig
    return help_field(next(f for f in fields(source) if f.name == name).default, help)


@dataclass
class HybridArgumentsMixin:
    """The hybrid fields; see each field's help."""

    hybrid_enabled: bool = help_field(
        True, "Route optimizer steps through the phase machine. False: exactly the plain Trainer."
    )
    hybrid_warmup_steps: int = _engine_field(
        "warmup_steps",
        "Ordinary steps at the start during which the predictors only observe (>= 0).",
    )
    hybrid_full_steps: int = _engine_field("full_steps", "Real steps between two predict phases (>= 0).")
    hybrid_min_predict_steps: int = _engine_field(
        "min_predict_steps", "Shortest predict horizon (>= 1, <= hybrid_max_predict_steps)."
    )
    hybrid_max_predict_steps: int = _engine_field(
        "max_predict_steps", "Longest predict horizon (>= hybrid_min_predict_steps, <= 1024)."
    )
    hybrid_confidence_threshold: float = _engine_field(
        "confidence_threshold",
        "Measured confidence (mean recent skill of the predicted updates, in [0, 1]) needed to enter a "
        "predict phase. 0 predicts whenever the schedule allows.",
    )
    hybrid_correction_interval: int = _engine_field(
        "correction_interval",
        "Insert a real CORRECT step after this many predicted steps (0: only at the end).",
    )
    hybrid_min_history: int = _engine_field(
        "min_history", "Real updates the predictor must have seen before a predict phase (>= 1)."
    )
    hybrid_predictor: str = _engine_field(
        "predictor",
        "Weight-delta predictor: a registered name (built-in: adam, ema, null; see "
        "`hf_hybrid.register_predictor`) or auto (`adam`, which replays torch Adam/AdamW with no extra "
        "buffer, when the optimizer allows, else `ema`).",
    )
    hybrid_predictor_kwargs: dict | str | None = help_field(
        None, "Constructor arguments of the predictor, a JSON object (e.g. '{\"beta\": 0.8}')."
    )
    hybrid_check_every: int = _engine_field(
        "check_every",
        "Measure the loss (forward pass) on every n-th predicted step (1: all; 0: none, blind).",
    )
    hybrid_max_delta: float = _engine_field(
        "max_delta", "Trust region: largest predicted change relative to the weight, in (0, 1]."
    )
    hybrid_rollback: bool = _engine_field(
        "rollback", "Roll back a predict phase whose loss regressed or diverged."
    )
    hybrid_divergence_sigma: float = _engine_field(
        "divergence_sigma", "Loss z-score that counts as divergence (> 0; 1.5x warns, 2x is critical)."
    )
    hybrid_snapshot_device: str = _engine_field(
        "snapshot_device", "Where the rollback snapshot lives: same (the parameters' device) or cpu."
    )
    hybrid_seed: int | None = help_field(
        None, "Seed of the engine's own generators (default: the training `seed`)."
    )
    hybrid_use_bandit: bool = _engine_field(
        "use_bandit", "Choose the horizon with a UCB1 bandit; False always uses the largest allowed."
    )
    hybrid_dormant_every: int = _engine_field(
        "dormant_every",
        "While the measured confidence is under half the threshold the engine sleeps: it keeps buffers for "
        "a sample of about 1 in 400 coordinates only and observes the (averaged) real update every n-th step "
        "(1: never sleeps: full-size buffers, every step).",
    )
    hybrid_probe_batches: int = help_field(
        0,
        "Validate each predict phase on this many fixed training-sized batches (eval mode, "
        "no_grad): it is kept only if their loss fell from the phase's start to its end (0: off, the "
        "noisier training-loss regression test decides).",
    )
    hybrid_console_metrics: str = help_field(
        "compact",
        "What the console shows of the hybrid/* metrics at each logging step: compact (the phase "
        "and the share of skipped backward passes) or full (every key). Trackers and trainer_state.json "
        "always get every key.",
    )
    hybrid_restart_engine: bool = help_field(
        False,
        "On resume, ignore the saved hybrid state and start a new engine (needed after changing "
        "the hybrid configuration or the trainable parameters); counters and timeline carry on.",
    )
    hybrid_spike_guard: str = help_field(
        "auto",
        "Judge every real step's loss before its update is applied. A spike is blamed first: "
        "its batch is measured again at the guard's copy of the weights; bad data (as bad there) is "
        "skipped and its step trained on a recent clean batch instead, damaged weights that do not "
        "come back by themselves within a few steps are restored "
        "from the copy (weights and optimizer state; the batches since skipped); an outsized update "
        "that did harm is taken back (kept at the last kept rate where its rate jumped). Every action "
        "is a warning, a hybrid/* metric, a timeline mark and "
        "a summary line. auto (the default): on whenever its copies fit (hybrid_guard_storage), off "
        "otherwise; on: always (with no copy that fits it only skips bad batches); off.",
        choices=list(SPIKE_GUARD_MODES),
    )
    hybrid_guard_storage: str = help_field(
        "auto",
        "Where the spike guard's two copies live: host (weights and optimizer state in host "
        "memory), weights (weights only; a restore resets the optimizer moments), checkpoint (none in "
        "memory: a restore reads the last checkpoint the Trainer saved), none (no copy: skips only), or "
        "auto: the first of host, weights, checkpoint that fits hybrid_guard_memory_mb.",
        choices=list(GUARD_STORAGE_CHOICES),
    )
    hybrid_guard_memory_mb: float | None = help_field(
        None,
        "Host memory the spike guard's copies may take, in MiB (default: a fifth of the host "
        "memory available when training starts). Copies that do not fit fall back to the next storage.",
    )
    hybrid_guard_every: int = help_field(
        _GUARD_DEFAULTS.every, "Optimizer steps between two copies of the spike guard (>= 1)."
    )
    hybrid_guard_spacing_mb: float = help_field(
        128.0,
        "A copy of up to this many MiB is taken every hybrid_guard_every steps; a larger one x2 "
        "further apart per doubling of its size, x16 at most (0: every hybrid_guard_every steps).",
    )
    hybrid_guard_max_update_ratio: float = help_field(
        _GUARD_DEFAULTS.max_update_ratio,
        "Take back an update over this many times the recent ones that did harm; where its learning "
        "rate jumped, keep it at the last kept update's rate instead (0: off).",
    )
    hybrid_guard_max_restores: int = field(
        default=_GUARD_DEFAULTS.max_restores,
        metadata={
            "help": f"At most this many restores in any {_GUARD_DEFAULTS.window} steps; after that the "
            "guard says so and lets the run train through until the window has passed (>= 0)."
        },
    )
    hybrid_guard_device: str = help_field(
        _GUARD_DEFAULTS.device,
        "Where the spike guard's host/weights copies live: cpu (host memory, pinned on CUDA) or "
        "same (the parameters' device).",
        choices=list(GUARD_DEVICES),
    )

    def __post_init__(self) -> None:
        self.validate_hybrid_args()
        super().__post_init__()  # type: ignore[misc]

    def validate_hybrid_args(self) -> None:
        """Raise a ValueError naming the `hybrid_*` field, its value and what is allowed."""
        try:
            for name in ("hybrid_enabled", "hybrid_restart_engine"):
                check_bool(name, getattr(self, name))
            check_int("hybrid_probe_batches", self.hybrid_probe_batches, 0, 1024)
            check_choice("hybrid_console_metrics", self.hybrid_console_metrics, CONSOLE_METRICS)
            check_choice("hybrid_spike_guard", self.hybrid_spike_guard, SPIKE_GUARD_MODES)
            check_choice("hybrid_guard_storage", self.hybrid_guard_storage, GUARD_STORAGE_CHOICES)
            if self.hybrid_guard_memory_mb is not None:
                check_float("hybrid_guard_memory_mb", self.hybrid_guard_memory_mb, 0.0, 1e12)
            check_float("hybrid_guard_spacing_mb", self.hybrid_guard_spacing_mb, 0.0, 1e12)
            if isinstance(self.hybrid_predictor_kwargs, str):
                self.hybrid_predictor_kwargs = _json_object(
                    "hybrid_predictor_kwargs", self.hybrid_predictor_kwargs
                )
            self.engine_config()
        except ConfigError as exc:
            raise ValueError(exc.message(hybrid_name)) from None
        try:
            self.spike_guard_config("host")
        except ConfigError as exc:
            raise ValueError(exc.message(lambda name: f"hybrid_guard_{name}")) from None

    def spike_guard_config(self, storage: str) -> SpikeGuardConfig:
        """The spike guard's settings, its copies in `storage` (`guard_storage.choose_storage`)."""
        return SpikeGuardConfig(
            enabled=self.hybrid_spike_guard != "off",
            every=self.hybrid_guard_every,
            max_update_ratio=self.hybrid_guard_max_update_ratio,
            max_restores=self.hybrid_guard_max_restores,
            device=self.hybrid_guard_device,
            storage=storage,
        )

    def engine_config(self) -> EngineConfig:
        """The engine's view: `hybrid_<name>` sets `<name>` of PhaseSchedule or EngineConfig."""
        schedule: dict[str, Any] = {}
        engine: dict[str, Any] = {}
        for f in hybrid_fields():
            target = engine_target(f.name)
            if target is not None:
                owner, name = target
                (schedule if owner == "schedule" else engine)[name] = getattr(self, f.name)
        if engine["seed"] is None:
            engine["seed"] = getattr(self, "seed", 0)
        if engine["predictor_kwargs"] is None:
            engine["predictor_kwargs"] = {}
        engine["probe_cost"] = self.hybrid_probe_batches / getattr(self, "gradient_accumulation_steps", 1)
        return EngineConfig(schedule=PhaseSchedule(**schedule), **engine)

    def hybrid_dict(self) -> dict[str, Any]:
        """The `hybrid_*` values, with the engine seed resolved (as the run used it)."""
        values = {f.name: getattr(self, f.name) for f in hybrid_fields()}
        if values["hybrid_seed"] is None:
            values["hybrid_seed"] = getattr(self, "seed", 0)
        return values


def hybrid_fields() -> tuple[Field, ...]:
    return fields(HybridArgumentsMixin)


def hybrid_name(engine_name: str) -> str:
    """`warmup_steps` -> `hybrid_warmup_steps`: messages speak the user's argument names."""
    if engine_name == "probe_cost":
        return "hybrid_probe_batches"
    return engine_name if engine_name.startswith(PREFIX) else PREFIX + engine_name


def _json_object(name: str, text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(name, text, f"a JSON object ({exc.msg})") from None
    if not isinstance(value, dict):
        raise ConfigError(name, text, "a JSON object")
    return value
