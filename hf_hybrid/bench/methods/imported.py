"""A user's own method, named by import path: `my_pkg.tricks:MyTrainer`, `my_pkg.tricks:MyCallback`, or
`my_pkg.tricks:MyMethod:option=value,...`.

A `Trainer` subclass gets the arena's arguments, model and data exactly as the plain run does; a callback
class is instantiated without arguments and added to a plain `Trainer`; the step cost of either is
measured by running it, averaged over the calibration steps. A method whose cost changes during the run
should be a `Method` subclass that counts its kinds of step; it takes options after a second colon.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from transformers import Trainer, TrainerCallback

from .base import SEPARATE_RUNS, STEP, Method, MethodError, TrialContext
from .specs import import_object, parse_options

if TYPE_CHECKING:
    from transformers import Trainer


def imported_method(spec: str) -> Method:
    """The method `spec` names by import path (see the module docstring)."""
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

    def own_kinds(self) -> tuple[str, ...]:
        return (self.kind(STEP),)
