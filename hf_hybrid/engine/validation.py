"""Checks that refuse a bad configuration value with the field, the value and what is allowed."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any


class ConfigError(ValueError):
    """A configuration value out of range. `allowed` may name other fields in backticks, which
    `message(rename)` renames too (the arguments layer shows its `hybrid_*` names)."""

    def __init__(self, name: str, value: Any, allowed: str) -> None:
        self.name = name
        self.value = value
        self.allowed = allowed
        super().__init__(self.message())

    def message(self, rename: Callable[[str], str] = str) -> str:
        allowed = re.sub(r"`(\w+)`", lambda m: f"`{rename(m.group(1))}`", self.allowed)
        return f"`{rename(self.name)}` must be {allowed}, got {self.value!r}"


def check_int(name: str, value: Any, low: int, high: int | None = None, bounds: str = "") -> None:
    """`bounds` replaces the printed range when a bound comes from another field."""
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= low
    if ok and high is not None:
        ok = value <= high
    if not ok:
        allowed = bounds or (f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]")
        raise ConfigError(name, value, allowed)


def check_float(
    name: str, value: Any, low: float, high: float, low_open: bool = False, high_open: bool = False
) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        interval = f"{'(' if low_open else '['}{float(low)}, {float(high)}{')' if high_open else ']'}"
        raise ConfigError(name, value, f"a number in {interval}")


def check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ConfigError(name, value, "True or False")


def check_choice(name: str, value: Any, choices: list[str] | tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(name, value, f"one of {list(choices)}")
