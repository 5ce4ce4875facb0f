"""What an arena method is: a named plug-in that builds the trainer of one run.

Its cost is counted in kinds of steps (`step_counts`): `step` (forward, backward, optimizer), `forward`,
`blind` (no pass over the model), kinds of its own that the arena prices by running it (`own_kinds`), and
`engine_ms`: milliseconds its own machinery measured itself spending on the run's clock (the hybrid
engine's work, a predicted step's update included); nothing is assumed (a small CPU model's backward costs
0.64 forwards, not 2). A task whose batches vary in
shape is counted in tokens (`token_kind`): what packing saves is padding, which a price per step misses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

if TYPE_CHECKING:
    from ..task import BenchTask

STEP, FORWARD, BLIND, TOKEN, ENGINE_MS = "step", "forward", "blind", "token", "engine_ms"


def prices_tokens(task: BenchTask) -> bool:
    """Whether `task` is priced per token (padding included): its collator pads per batch."""
    return bool(getattr(task.data_collator, "prices_tokens", False))


def token_kind(kind: str) -> str:
    """The per-token price of a kind of step: a plain step's `token`, a method's own `<spec>:token`."""
    if kind == STEP:
        return TOKEN
    spec, _, label = kind.rpartition(":")
    return f"{spec}:{TOKEN}" if spec and label == STEP else f"{kind}:{TOKEN}"


def counts_tokens(trainer: Trainer) -> bool:
    """The Trainer counts its tokens (`num_input_tokens_seen`, from step 0: it travels in checkpoints)."""
    return getattr(trainer.args, "include_num_input_tokens_seen", "no") == "all"


# How the arena gets a method's runs at the budgets (`plan.py`):
BRANCHED = "branched"  # one warmup-stable-decay trunk, a cooldown branch per budget (the default)
CONSTANT = "constant"  # no decay to branch (schedule-free): each budget is the trunk stopped there
SEPARATE_RUNS = "separate"  # its own behaviour depends on the total budget: a complete run per budget


class MethodError(ValueError):
    """A method spec that cannot be built: the message names the method, the option and what is allowed."""


@dataclass
class TrialContext:
    """Everything one run needs: the task, the shared arguments, callbacks, a null control's phases."""

    task: BenchTask
    learning_rate: float
    seed: int
    steps: int
    output_dir: str
    eval_points: int = 4
    callbacks: Sequence[TrainerCallback] = ()
    replay: Sequence[str] | None = None
    resume_from: str | None = None  # the checkpoint the run continues (a method's own state lives there too)
    extra_args: Mapping[str, Any] = field(default_factory=dict)  # e.g. no evaluation while calibrating

    def training_arguments(self, cls: type | None = None, **overrides: Any) -> TrainingArguments:
        """The arguments every run shares (the task's, at its rate, seed and budget), plus `overrides`."""
        every = max(1, self.steps // max(1, self.eval_points))
        common: dict[str, Any] = {
            "output_dir": self.output_dir,
            "max_steps": self.steps,
            "per_device_train_batch_size": self.task.batch_size,
            "per_device_eval_batch_size": self.task.eval_batch_size,
            "gradient_accumulation_steps": self.task.gradient_accumulation_steps,
            "learning_rate": self.learning_rate,
            "weight_decay": self.task.weight_decay,
            "lr_scheduler_type": self.task.lr_scheduler_type,
            "warmup_steps": round(self.task.warmup_ratio * self.steps),
            "eval_strategy": "steps",
            "eval_steps": every,
            "logging_steps": every,
            "save_strategy": "no",
            "report_to": "none",
            "seed": self.seed,
            "data_seed": self.seed,
            "disable_tqdm": True,
            "dataloader_num_workers": 0,
            "use_cpu": not torch.cuda.is_available(),
            **({"include_num_input_tokens_seen": "all"} if prices_tokens(self.task) else {}),
            **self.task.training_overrides,
            **self.extra_args,
        }
        return (cls or TrainingArguments)(**{**common, **overrides})

    def trainer_kwargs(self, model: Any, train: Any, evaluation: Any) -> dict[str, Any]:
        """The keyword arguments every Trainer of the run gets besides `args`."""
        kwargs: dict[str, Any] = {
            "model": model,
            "train_dataset": train,
            "eval_dataset": evaluation,
            "callbacks": list(self.callbacks),
        }
        if self.task.data_collator is not None:
            kwargs["data_collator"] = self.task.data_collator
        return kwargs


@dataclass
class Method:
    """One plug-in, parsed from its spec (`name` or `name:option=value,...`)."""

    spec: str
    options: Mapping[str, str] = field(default_factory=dict)

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    option_help: ClassVar[Mapping[str, str]] = {}
    positional: ClassVar[str | None] = None  # `freeze:3` means `freeze:k=3`
    replays_parent: ClassVar[bool] = False  # a null control that replays its parent run's phases
    budget_schedule: ClassVar[str] = BRANCHED
    rate_scale: ClassVar[float] = 1.0  # its race's centre, x plain's full-budget rate
    own_step: ClassVar[bool] = False  # its steps priced on their own, `kind(STEP)` (e.g. a frozen model)

    @property
    def same_trajectory(self) -> bool:
        """It trains plain's trajectory (a compiler, a fused kernel): judged in time at plain's rate."""
        return False

    def __post_init__(self) -> None:
        unknown = sorted(set(self.options) - set(self.option_help))
        if unknown:
            allowed = ", ".join(f"{k} ({v})" for k, v in self.option_help.items()) or "none"
            raise MethodError(f"method {self.spec!r}: unknown option(s) {unknown}; options: {allowed}")

    def build(self, ctx: TrialContext) -> Trainer:
        raise NotImplementedError

    def check_model(self, model: Any) -> None:
        """Refuse a model this method cannot run on (called once, before anything trains)."""

    def step_counts(self, trainer: Trainer, steps: int) -> dict[str, int]:
        """How many steps of each kind the run took so far (`steps` optimizer steps done)."""
        kind = self.own_kinds()[0] if self.own_kinds() else STEP
        if counts_tokens(trainer):  # a task priced per token: the tokens of those steps
            return {token_kind(kind): int(trainer.state.num_input_tokens_seen)}
        return {kind: steps}

    def own_kinds(self) -> tuple[str, ...]:
        """Step kinds whose cost is this method's alone, measured by running it (empty: the shared ones)."""
        return (self.kind(STEP),) if self.own_step else ()

    def calibration_variant(self, kind: str) -> Method:
        """A method whose every step is of `kind` (what the arena times to price that kind)."""
        return self

    def null_spec(self) -> str | None:
        return None

    def declines(self, task: BenchTask) -> str | None:
        """Why this method has nothing to do on `task` (it is then not run), or None."""
        return None

    def provably_plain(self, max_steps: int, steps: int | None = None) -> str | None:
        """Why a run `steps` long (default: all `max_steps`) trains exactly like plain (reused), or None."""
        return None

    def describe_run(self, trainer: Trainer) -> dict[str, Any]:
        """Extra facts about a finished run for the record (JSON-able), e.g. what a hybrid run did."""
        return {}

    def note(self, trainer: Trainer) -> str | None:
        """One sentence when the run could not do what the method is for (it is then the plain run)."""
        return None

    def kind(self, label: str) -> str:
        """A kind of this method's own, named so that two specs never share a price by accident."""
        return f"{self.spec}:{label}"

    def option(self, key: str, cast: type, default: Any, check: Any = None, allowed: str = "") -> Any:
        """`options[key]` as `cast` (default when absent), refused with the method, option and range."""
        if key not in self.options:
            return default
        text = self.options[key]
        try:
            value = cast(text)
        except ValueError:
            raise MethodError(
                f"method {self.spec!r}: `{key}` must be {cast.__name__}, got {text!r}"
            ) from None
        if check is not None and not check(value):
            raise MethodError(f"method {self.spec!r}: `{key}` must be {allowed}, got {text!r}")
        return value
