"""Method names to classes, and specs (`name`, `name:option=value,...`, `module.path:Name`) to methods;
the package registers the built-ins (importing none here: no cycle)."""

from __future__ import annotations

from .base import Method, MethodError
from .imported import imported_method
from .specs import parse_options

NULL = "null"  # not a class: the null control of every other method in the list that names one
_REGISTRY: dict[str, type[Method]] = {}
_BUILTINS: set[str] = set()


def register_method(cls: type[Method]) -> type[Method]:
    """Make `cls.name` a method spec (usable as a decorator). A built-in name cannot be shadowed."""
    if not (isinstance(cls, type) and issubclass(cls, Method)):
        raise TypeError(f"register_method needs a Method subclass, got {cls!r}")
    name = cls.name
    if not name or ":" in name or "." in name or "," in name:
        raise ValueError(f"{cls.__qualname__}.name must be a plain word (no ':', '.', ','), got {name!r}")
    if name in _BUILTINS or name == NULL:
        raise ValueError(f"{name!r} is a built-in method and cannot be replaced")
    _REGISTRY[name] = cls
    return cls


def unregister_method(name: str) -> None:
    if name in _BUILTINS:
        raise ValueError(f"{name!r} is a built-in method and cannot be unregistered")
    _REGISTRY.pop(name, None)


def builtin(cls: type[Method]) -> type[Method]:
    register_method(cls)
    _BUILTINS.add(cls.name)
    return cls


def available_methods() -> list[str]:
    return sorted([*_REGISTRY, NULL])


def describe_methods() -> dict[str, str]:
    described = {name: cls.summary for name, cls in _REGISTRY.items()}
    described[NULL] = "adds the null control of every other method listed that has one"
    return dict(sorted(described.items()))


def parse_method(spec: str) -> Method:
    """The method a spec names; an unknown one is refused with the known names listed."""
    spec = spec.strip()
    name, _, rest = spec.partition(":")
    if name == NULL:
        raise MethodError(f"{NULL!r} is not run alone: it adds the null control of every other method listed")
    if name in _REGISTRY:
        cls = _REGISTRY[name]
        return cls(spec, parse_options(rest, cls.positional, spec))
    if rest and ("." in name or rest[:1].isupper()):
        return imported_method(spec)
    raise MethodError(
        f"unknown method {spec!r}; methods: {', '.join(available_methods())}, or module.path:Name of a "
        "Trainer subclass or TrainerCallback"
    )
