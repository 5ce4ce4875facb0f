"""What the hybrid machinery costs, by part, on the same clock as the steps it is part of.

Everything the hybrid trainer adds to a step is charged to a named part; parts nest and time goes to the
innermost open one (nothing counted twice); `outside()` marks the plain step's own work inside a part.
The clock is CPU time on the host (a shared machine's load stretches wall-clock, not CPU time), and
wall-clock on an accelerator, where the engine's share is host time (kernels run asynchronously).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch


def clock_for(tensors: Iterable[torch.Tensor]) -> Callable[[], float]:
    """CPU time of the process for host tensors, wall-clock when any lives on an accelerator."""
    on_host = all(t.device.type == "cpu" for t in tensors)
    return time.process_time if on_host else time.perf_counter


class _Span:
    """`with timer.part(name):` — a class, not a generator context manager: it runs many times a step."""

    __slots__ = ("name", "timer")

    def __init__(self, timer: PartTimer, name: str | None) -> None:
        self.timer = timer
        self.name = name

    def __enter__(self) -> None:
        self.timer._push(self.name)

    def __exit__(self, *exc: Any) -> None:
        self.timer._pop()


class PartTimer:
    """Seconds per part (`seconds`), and of the steps they belong to (`step_seconds`, `steps`)."""

    def __init__(self, clock: Callable[[], float] = time.process_time) -> None:
        self.clock = clock
        self.seconds: dict[str, float] = {}
        self.step_seconds = 0.0
        self.steps = 0
        self._open: list[str | None] = []  # the open parts, innermost last; None: `outside`
        self._since = 0.0  # when the innermost open part last started or resumed
        self._step_started: float | None = None

    def part(self, name: str) -> _Span:
        return _Span(self, name)

    def outside(self) -> _Span:
        """Time inside an open part that belongs to no part (the plain step's own work)."""
        return _Span(self, None)

    def _charge(self) -> float:
        now = self.clock()
        if self._open and self._open[-1] is not None:
            name = self._open[-1]
            self.seconds[name] = self.seconds.get(name, 0.0) + (now - self._since)
        self._since = now
        return now

    def _push(self, name: str | None) -> None:
        self._charge()
        self._open.append(name)

    def _pop(self) -> None:
        self._charge()
        self._open.pop()

    def start_step(self) -> None:
        self._step_started = self.clock()

    def end_step(self) -> None:
        if self._step_started is not None:
            self.step_seconds += self.clock() - self._step_started
            self.steps += 1
            self._step_started = None

    @property
    def total(self) -> float:
        return sum(self.seconds.values())

    def summary(self) -> dict[str, Any]:
        """Seconds of all parts, of the steps, their ratio, and each part's share of the step time."""
        total, steps = self.total, self.step_seconds
        return {
            "engine_seconds": total,
            "step_seconds": steps,
            "engine_time_share": total / steps if steps > 0 else 0.0,
            "parts": {name: s / steps if steps > 0 else 0.0 for name, s in sorted(self.seconds.items())},
            "part_seconds": dict(sorted(self.seconds.items())),
        }

    def state_dict(self) -> dict[str, Any]:
        return {"parts": dict(self.seconds), "step_seconds": self.step_seconds, "steps": self.steps}

    def load_state_dict(self, state: Mapping[str, Any] | None) -> None:
        """Carry on from a saved timing (None: restart)."""
        if state is None:
            return
        self.seconds = {name: float(s) for name, s in state["parts"].items()}
        self.step_seconds = float(state["step_seconds"])
        self.steps = int(state["steps"])
