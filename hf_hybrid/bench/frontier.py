"""Speed-up at equal quality, from the plain Trainer's frontier of (cost, final eval loss).

The frontier is made of complete plain runs at several step budgets, each with its own full
learning-rate schedule. The cost the plain Trainer needs to reach a loss L is read off the frontier
by linear interpolation between the two budgets that bracket L; outside the frontier only a bound
can be given, and the result says which.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Speedup:
    """`kind`: "interpolated"; "lower_bound" (better than every frontier point); "upper_bound" (worse than
    the cheapest one); "diverged"."""

    ratio: float  # plain cost to reach the loss / hybrid cost
    kind: str
    plain_cost: float


def envelope(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """(cost, loss) points sorted by cost, keeping only those that improve on every cheaper one."""
    best = math.inf
    out: list[tuple[float, float]] = []
    for cost, loss in sorted(points):
        if math.isfinite(loss) and loss < best:
            out.append((cost, loss))
            best = loss
    return out


def cost_to_reach(points: Sequence[tuple[float, float]], loss: float) -> tuple[float, str]:
    """Plain cost needed to reach `loss`, and how it was obtained."""
    frontier = envelope(points)
    if not frontier:
        raise ValueError("the plain frontier has no finite point")
    if loss <= frontier[-1][1]:
        return frontier[-1][0], "lower_bound" if loss < frontier[-1][1] else "interpolated"
    if loss > frontier[0][1]:
        return frontier[0][0], "upper_bound"
    for (c0, l0), (c1, l1) in zip(frontier, frontier[1:], strict=False):
        if l1 <= loss <= l0:
            return c0 + (c1 - c0) * (l0 - loss) / (l0 - l1), "interpolated"
    return frontier[0][0], "interpolated"  # loss equals the cheapest point's


def speedup(points: Sequence[tuple[float, float]], loss: float, cost: float) -> Speedup:
    """Plain cost to reach the hybrid run's final loss, divided by the hybrid run's cost."""
    if not math.isfinite(loss):
        return Speedup(0.0, "diverged", math.nan)
    if cost <= 0:
        raise ValueError(f"`cost` must be > 0, got {cost}")
    plain_cost, kind = cost_to_reach(points, loss)
    return Speedup(plain_cost / cost, kind, plain_cost)
