"""`--hybrid FIELD=VALUE` overrides, converted by the type of their `HybridArgumentsMixin` field: bool, int,
float, str, a `Literal`, dict or list (JSON), and their unions with None (`none`/`null`).
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

from ..hybrid_arguments import HybridArgumentsMixin

NONE_WORDS = ("none", "null")
TRUE_WORDS = ("true", "1", "yes")
FALSE_WORDS = ("false", "0", "no")


def parse_hybrid_overrides(items: Sequence[str]) -> dict[str, Any]:
    """`["hybrid_x=1", ...]` -> `{"hybrid_x": 1, ...}`; a ValueError names the field, value and type."""
    hints = typing.get_type_hints(HybridArgumentsMixin)
    names = sorted(f.name for f in fields(HybridArgumentsMixin))
    out: dict[str, Any] = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or name not in names:
            raise ValueError(f"--hybrid expects FIELD=VALUE with FIELD one of {names}, got {item!r}")
        out[name] = convert(name, hints[name], text)
    return out


def convert(name: str, hint: Any, text: str) -> Any:
    """`text` as a value of type `hint`; a ValueError names what was expected."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if type(None) in args and text.lower() in NONE_WORDS:
            return None
        members = sorted((a for a in args if a is not type(None)), key=lambda a: a is str)  # str: last resort
        for member in members:
            try:
                return convert(name, member, text)
            except ValueError:
                continue
        raise ValueError(f"`{name}`: {text!r} is not a {_type_name(hint)}")
    if origin is typing.Literal:
        for choice in args:
            if str(choice) == text:
                return choice
        raise ValueError(f"`{name}` must be one of {list(args)}, got {text!r}")
    if hint is bool:
        if text.lower() in TRUE_WORDS + FALSE_WORDS:
            return text.lower() in TRUE_WORDS
        raise ValueError(f"`{name}` must be one of {list(TRUE_WORDS + FALSE_WORDS)}, got {text!r}")
    if hint in (int, float, str):
        try:
            return hint(text)
        except ValueError:
            raise ValueError(f"`{name}` must be {_type_name(hint)}, got {text!r}") from None
    container = {dict: dict, list: list, tuple: list}.get(origin or hint)
    if container is not None:
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = None
        if not isinstance(value, container):
            kind = "a JSON object" if container is dict else "a JSON array"
            raise ValueError(f"`{name}` must be {kind}, got {text!r}")
        return value
    raise ValueError(f"`{name}` has a type the command line cannot give ({_type_name(hint)})")


def _type_name(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(hint))
    if hint is type(None):
        return "none"
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", dict: "a JSON object"}
    return names.get(origin or hint, getattr(hint, "__name__", str(hint)))
