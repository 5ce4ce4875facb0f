"""The built-in methods that are a Trainer as it is: `plain`, `args`, `hybrid`, `hybrid-predict` and the
hybrid runs' null control `null-hybrid`."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, ClassVar

from transformers import Trainer, TrainingArguments

from ...args import HybridTrainingArguments
from ...engine.phases import Phase
from ...trainer import HybridHFTrainer
from ..overrides import convert, parse_hybrid_overrides
from .base import BLIND, BRANCHED, CONSTANT, ENGINE_MS, FORWARD, STEP, Method, MethodError, TrialContext

# `TrainingArguments` fields that change how a step is computed, not what it computes
SAME_TRAJECTORY_FIELDS = frozenset(
    {
        "torch_compile",
        "torch_compile_backend",
        "torch_compile_mode",
        "use_liger_kernel",
        "gradient_checkpointing",
        "dataloader_num_workers",
        "dataloader_pin_memory",
        "dataloader_persistent_workers",
        "tf32",
    }
)
SAME_TRAJECTORY_OPTIMIZERS = frozenset({"adamw_torch", "adamw_torch_fused"})
# `TrainingArguments` fields that never touch a training step: a method that changes only these is plain
# under another name, its steps priced as plain's (a price of its own would read calibration noise as a
# speed-up: fused AdamW, the default, was once priced 3% apart from plain)
BOOKKEEPING_FIELDS = frozenset(
    {"logging_steps", "logging_first_step", "logging_nan_inf_filter", "report_to", "run_name", "disable_tqdm"}
)
RUN_STATS = ("steps_per_phase", "backward_skipped_fraction", "rollbacks", "predict_phases", "max_confidence")


class Plain(Method):
    name: ClassVar[str] = "plain"
    summary: ClassVar[str] = "transformers.Trainer as it is (the baseline every method is judged against)"

    def build(self, ctx: TrialContext) -> Trainer:
        model, train, evaluation = ctx.task.build(ctx.seed)
        return Trainer(args=ctx.training_arguments(), **ctx.trainer_kwargs(model, train, evaluation))


class TrainingArgumentsOverride(Method):
    """The plain Trainer with `TrainingArguments` fields changed: exact tricks judged like any method."""

    name: ClassVar[str] = "args"
    summary: ClassVar[str] = (
        "the plain Trainer with TrainingArguments overrides, e.g. args:torch_compile=true or "
        "args:optim=adamw_torch_fused"
    )
    own_step: ClassVar[bool] = True

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(TrainingArguments)
        names = {f.name for f in dataclasses.fields(TrainingArguments) if f.init}
        if not self.options:
            raise MethodError(f"method {self.spec!r}: give at least one TrainingArguments field=value")
        self.overrides = {}
        for key, text in self.options.items():
            if key not in names:
                raise MethodError(f"method {self.spec!r}: {key!r} is not a TrainingArguments field")
            try:
                self.overrides[key] = convert(key, hints[key], text)
            except ValueError as exc:
                raise MethodError(f"method {self.spec!r}: {exc}") from None
        optimizer = str(self.overrides.get("optim", ""))
        self.budget_schedule = CONSTANT if optimizer.startswith("schedule_free") else BRANCHED
        if self.budget_schedule == CONSTANT:
            try:
                import schedulefree  # noqa: F401
            except ImportError:
                raise MethodError(
                    f"method {self.spec!r} needs the schedulefree package: pip install schedulefree"
                ) from None

    def own_kinds(self) -> tuple[str, ...]:
        """Its own price, unless it changes only bookkeeping (then its steps are plain's steps)."""
        return () if set(self.overrides) <= BOOKKEEPING_FIELDS else super().own_kinds()

    @property
    def same_trajectory(self) -> bool:
        """Compilers, fused kernels, data-loading and checkpointing flags compute the plain step itself."""
        return all(
            key in SAME_TRAJECTORY_FIELDS or (key == "optim" and str(value) in SAME_TRAJECTORY_OPTIMIZERS)
            for key, value in self.overrides.items()
        )

    def build(self, ctx: TrialContext) -> Trainer:
        model, train, evaluation = ctx.task.build(ctx.seed)
        args = ctx.training_arguments(**self.overrides)
        return Trainer(args=args, **ctx.trainer_kwargs(model, train, evaluation))


class Hybrid(Method):
    """`HybridHFTrainer` with any `hybrid_*` override (the prefix optional)."""

    name: ClassVar[str] = "hybrid"
    summary: ClassVar[str] = "HybridHFTrainer; hybrid:field=value,... sets any hybrid_* argument"
    preset: ClassVar[dict[str, str]] = {}

    def __post_init__(self) -> None:
        items = {**self.preset, **{_hybrid_field(k): v for k, v in self.options.items()}}
        try:
            self.overrides = parse_hybrid_overrides([f"{k}={v}" for k, v in items.items()])
            HybridTrainingArguments(output_dir="unused", **self.overrides)  # a bad value refused here
        except ValueError as exc:
            raise MethodError(f"method {self.spec!r}: {exc}") from None

    def build(self, ctx: TrialContext) -> Trainer:
        model, train, evaluation = ctx.task.build(ctx.seed)
        args = ctx.training_arguments(HybridTrainingArguments, **self.settings(ctx.task.max_steps))
        return HybridHFTrainer(
            args=args, **self._extra(args, ctx), **ctx.trainer_kwargs(model, train, evaluation)
        )

    def _extra(self, args: Any, ctx: TrialContext) -> dict[str, Any]:
        return {}

    def settings(self, max_steps: int) -> dict[str, Any]:
        """The `hybrid_*` arguments for a full budget of `max_steps` (one for trunk and branches)."""
        return dict(self.overrides)

    def provably_plain(self, max_steps: int, steps: int | None = None) -> str | None:
        steps = max_steps if steps is None else steps
        settings = self.settings(max_steps)
        if not settings.get("hybrid_enabled", True):
            return "hybrid_enabled=False: the plain Trainer"
        warmup = settings.get("hybrid_warmup_steps", HybridTrainingArguments.hybrid_warmup_steps)
        if self.replays_parent or warmup < steps:
            return None
        return f"its warmup ({warmup} steps) covers the whole budget ({steps} steps): plain steps only"

    def step_counts(self, trainer: Trainer, steps: int) -> dict[str, int]:
        engine = getattr(trainer, "engine", None)
        if engine is None:  # disabled, or refused by the set-up: plain steps
            return {STEP: steps}
        counters = engine.counters
        probe_forwards = counters["probe_evaluations"] * trainer.args.hybrid_probe_batches
        return {
            STEP: counters["backward_run"],
            FORWARD: counters["predict_checked"] + probe_forwards,
            BLIND: counters["predict_blind"],
            ENGINE_MS: round(1000 * engine.seconds),  # its own work, predicted updates included
        }

    def null_spec(self) -> str | None:
        options = ",".join(f"{k}={v}" for k, v in {**self.preset, **self.options}.items())
        return NullHybrid.name + (f":{options}" if options else "")

    def describe_run(self, trainer: Trainer) -> dict[str, Any]:
        if getattr(trainer, "engine", None) is None:
            return {}
        stats = trainer.hybrid_stats()
        return {
            **{key: stats[key] for key in RUN_STATS},
            "engine_time_share": stats["timing"]["engine_time_share"],
            "phases": [row["phase"] for row in trainer.hybrid_timeline],
        }

    def note(self, trainer: Trainer) -> str | None:
        engine = getattr(trainer, "engine", None)
        if engine is None:
            return "the hybrid engine did not run (hybrid_enabled=False or an unsupported set-up)"
        return trainer.hybrid_stats()["no_predict_reason"]


class HybridPredict(Hybrid):
    """The hybrid trainer forced to predict, with the best settings so far (`benchmarks/README.md`)."""

    name: ClassVar[str] = "hybrid-predict"
    summary: ClassVar[str] = (
        "HybridHFTrainer forced to predict with the best settings found so far (threshold 0.3, blind, "
        "warmup 50, full 10, horizon <= 8, bandit off); options as for hybrid"
    )
    preset: ClassVar[dict[str, str]] = {
        "hybrid_confidence_threshold": "0.3",
        "hybrid_check_every": "0",
        "hybrid_warmup_steps": "50",
        "hybrid_full_steps": "10",
        "hybrid_max_predict_steps": "8",
        "hybrid_use_bandit": "false",
    }

    def settings(self, max_steps: int) -> dict[str, Any]:
        """The preset's phases, scaled down under 200 steps so that it still predicts; options given win."""
        settings = dict(self.overrides)
        given = {_hybrid_field(k) for k in self.options}
        scaled = {
            "hybrid_warmup_steps": min(50, max(1, max_steps // 4)),
            "hybrid_full_steps": min(10, max(1, max_steps // 20)),
            "hybrid_max_predict_steps": min(8, max(2, max_steps // 20)),
            "hybrid_min_history": min(8, max(2, max_steps // 25)),
        }
        scaled["hybrid_min_predict_steps"] = min(2, scaled["hybrid_max_predict_steps"])
        settings.update({k: v for k, v in scaled.items() if k not in given})
        return settings


class NullHybrid(Hybrid):
    """A hybrid run's null control: its phases replayed with the null predictor (nothing applied)."""

    name: ClassVar[str] = "null-hybrid"
    summary: ClassVar[str] = "a hybrid run's phases replayed with nothing applied (added by `null`)"
    replays_parent: ClassVar[bool] = True

    def _extra(self, args: Any, ctx: TrialContext) -> dict[str, Any]:
        if ctx.replay is None:
            raise MethodError(f"method {self.spec!r} replays a hybrid run's phases; none was given")
        config = args.engine_config()
        schedule = dataclasses.replace(config.schedule, script=tuple(Phase(p) for p in ctx.replay))
        return {"engine_config": dataclasses.replace(config, predictor="null", schedule=schedule)}

    def null_spec(self) -> str | None:
        return None


def _hybrid_field(key: str) -> str:
    return key if key.startswith("hybrid_") else f"hybrid_{key}"
