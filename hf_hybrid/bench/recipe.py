"""How another process builds the same task: a `BenchTask`'s recipe, plain JSON.

A worker (a local process or a Ray task) gets the recipe, not the task: the model and data are built
where the run happens, from the preset's name, the user's flags, or the factory's import path. A task
built in code by hand has no recipe and runs in this process only.
"""

from __future__ import annotations

from typing import Any

from ..data import DataError
from .methods.specs import import_object
from .task import BenchTask
from .tasks import preset
from .user_task import UserTaskOptions, build_user_task

OVERRIDABLE = ("max_steps", "batch_size", "eval_batch_size", "learning_rate")


def preset_recipe(name: str, size: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"preset": name, "size": size, "overrides": dict(overrides or {})}


def factory_recipe(spec: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"factory": spec, "overrides": dict(overrides or {})}


def build_task(recipe: dict[str, Any]) -> BenchTask:
    """The task a recipe describes (the same identity as the coordinator's)."""
    if "preset" in recipe:
        task = preset(recipe["preset"], recipe["size"])
    elif "user" in recipe:
        task = build_user_task(UserTaskOptions(**recipe["user"]))
    elif "factory" in recipe:
        task = import_object(recipe["factory"])()
    else:
        raise DataError(f"a task recipe names a preset, a user task or a factory, got {sorted(recipe)}")
    for name, value in recipe.get("overrides", {}).items():
        if name not in OVERRIDABLE:
            raise DataError(f"a task recipe can override {list(OVERRIDABLE)}, not {name!r}")
        setattr(task, name, value)
    task.recipe = recipe
    return task
