"""Reading a method spec: `name:option=value,...` options, and `module.path:Name` imports."""

from __future__ import annotations

import importlib

from .base import MethodError


def parse_options(text: str, positional: str | None, spec: str) -> dict[str, str]:
    """`k=v,k=v` (commas in brackets do not split) into a dict; a bare value is the positional option."""
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
