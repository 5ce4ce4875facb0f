"""A user's own `Trainer` subclass or `TrainerCallback`, named by import path (`my_pkg.tricks:MyTrainer`).

The class gets the arena's arguments, model and data exactly as the plain run does; a callback class is
instantiated without arguments and added to a plain `Trainer`. Its step cost is measured by running it,
averaged over the calibration steps (a method whose cost changes during the run should be a `Method`
subclass that counts its kinds of step: `register_method`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import STEP, Method, MethodError, TrialContext
from .registry import import_object

if TYPE_CHECKING:
    from transformers import Trainer


class ImportedMethod(Method):
    summary = "module.path:Name — your own Trainer subclass or TrainerCallback"

    def __post_init__(self) -> None:
        from transformers import Trainer, TrainerCallback

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
                f"method {self.spec!r}: {type(target).__name__} {target!r} is neither a Trainer subclass "
                "nor a TrainerCallback"
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
