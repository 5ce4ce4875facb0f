"""A user's own method by import path: `pkg.mod:MyTrainer`, `pkg.mod:MyCallback` (added to a plain
`Trainer`) or `pkg.mod:MyMethod:option=value,...` (a `Method` subclass); the first two priced by timing.
"""

from __future__ import annotations

from typing import Any

from transformers import Trainer, TrainerCallback

from .base import SEPARATE_RUNS, Method, MethodError, TrialContext
from .specs import import_object, parse_options


def imported_method(spec: str) -> Method:
    module, _, rest = spec.partition(":")
    attr, _, options = rest.partition(":")
    target = import_object(f"{module}:{attr}")
    if isinstance(target, type) and issubclass(target, Method):
        return target(spec, parse_options(options, target.positional, spec))
    if options:
        raise MethodError(f"method {spec!r}: options need a hf_hybrid.bench.Method subclass, not {attr}")
    return ImportedMethod(spec)


class ImportedMethod(Method):
    """Its state is not known to survive a checkpoint, so each budget it is read at runs separately."""

    summary = "module.path:Name — your own Trainer subclass or TrainerCallback"
    budget_schedule = SEPARATE_RUNS
    own_step = True

    def __post_init__(self) -> None:
        target: Any = import_object(self.spec)
        if isinstance(target, type) and issubclass(target, Trainer):
            self.trainer_class, self.callback = target, None
        elif (
            isinstance(target, type)
            and issubclass(target, TrainerCallback)
            or isinstance(target, TrainerCallback)
        ):
            self.trainer_class, self.callback = Trainer, target
        else:
            raise MethodError(
                f"method {self.spec!r}: {type(target).__name__} {target!r} is neither a Trainer subclass, "
                "a TrainerCallback nor a hf_hybrid.bench.Method subclass"
            )

    def build(self, ctx: TrialContext) -> Trainer:
        model, train, evaluation = ctx.task.build(ctx.seed)
        kwargs = ctx.trainer_kwargs(model, train, evaluation)
        if self.callback is not None:
            callback = self.callback() if isinstance(self.callback, type) else self.callback
            kwargs["callbacks"] = [*kwargs["callbacks"], callback]
        return self.trainer_class(args=ctx.training_arguments(), **kwargs)
