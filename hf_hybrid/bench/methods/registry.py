"""Method names to classes, and specs (`name`, `name:option=value,...`, `module.path:Name`) to methods."""

from __future__ import annotations

import importlib

from .base import Method, MethodError

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
    _load_builtins()
    return sorted([*_REGISTRY, NULL])


def describe_methods() -> dict[str, str]:
    """Each method's name and one line on what it runs."""
    _load_builtins()
    described = {name: cls.summary for name, cls in _REGISTRY.items()}
    described[NULL] = "adds the null control of every other method listed that has one"
    return dict(sorted(described.items()))


def parse_options(text: str, positional: str | None, spec: str) -> dict[str, str]:
    """`k=v,k=v` (commas inside brackets or braces do not split: JSON values pass) into a dict; a bare
    value is the method's positional option (`freeze:3`)."""
    if not text:
        return {}
    items, depth, current = [], 0, ""
    for char in text:
        depth += char in "[{("
        depth -= char in "]})"
        if char == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += char
    items.append(current)
    options: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            if positional is None or options:
                raise MethodError(f"method {spec!r}: expected option=value, got {item!r}")
            key, value = positional, item
        if not key.strip():
            raise MethodError(f"method {spec!r}: an option has no name in {item!r}")
        options[key.strip()] = value.strip()
    return options


def parse_method(spec: str) -> Method:
    """The method a spec names; an unknown one is refused with the known names listed."""
    _load_builtins()
    spec = spec.strip()
    name, _, rest = spec.partition(":")
    if name == NULL:
        raise MethodError(f"{NULL!r} is not run alone: it adds the null control of every other method listed")
    if name in _REGISTRY:
        cls = _REGISTRY[name]
        return cls(spec, parse_options(rest, cls.positional, spec))
    if rest and ("." in name or rest[:1].isupper()):
        from .imported import imported_method

        return imported_method(spec)
    raise MethodError(
        f"unknown method {spec!r}; methods: {', '.join(available_methods())}, or module.path:Name of a "
        "Trainer subclass or TrainerCallback"
    )


def import_object(spec: str) -> object:
    """`module.path:Name` imported, with a message that says which part failed."""
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise MethodError(f"method {spec!r}: cannot import module {module_name!r} ({exc})") from exc
    if not hasattr(module, attr):
        raise MethodError(f"method {spec!r}: module {module_name!r} has no attribute {attr!r}")
    return getattr(module, attr)


def _load_builtins() -> None:
    from . import builtin as _  # noqa: F401 - registers plain, hybrid, args, ...
    from . import dropbp as _d  # noqa: F401
    from . import freeze as _f  # noqa: F401
    from . import peft_lora as _p  # noqa: F401
    from . import selective_backprop as _s  # noqa: F401
