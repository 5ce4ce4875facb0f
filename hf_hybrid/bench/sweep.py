"""The plain learning-rate sweep by successive halving, judged at each budget after its cooldown.

All rates run to the 1/4 budget; from each budget to the next go on the best rate and the one below it
(x0.5): a longer budget's best rate is never larger than a shorter one's (the short-horizon bias), so a
rate above the best, already worse at a shorter budget, is not carried on. At every budget the best rate
must be *interior*: the rate below it ran at this budget and did worse, and the rate above it did worse
here or at a shorter budget. Until it is, the sweep widens by x2 on that side (a rate dropped earlier
continues from its trunk, a new one starts), at most `widen` rates beyond the first grid per side; a best
rate still at an edge then leaves that budget's judge *untuned*, which the report and verdicts say.

The functions here are pure: the same points give the same decisions, whoever ran them and when.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .budget import BUDGETS

# (multiplier, budget) -> the point's eval loss, or None when it has not run yet
LossAt = Callable[[float, float], "float | None"]


@dataclass
class SweepState:
    """What the sweep has decided so far, and the points it still needs (`wanted`)."""

    active: dict[float, list[float]] = field(default_factory=dict)  # budget -> multipliers judged there
    best: dict[float, float] = field(default_factory=dict)  # budget -> best multiplier
    untuned: dict[float, str] = field(default_factory=dict)  # budget -> why its judge is not tuned
    wanted: list[tuple[float, float]] = field(default_factory=list)  # (multiplier, budget) to run next

    @property
    def complete(self) -> bool:
        return not self.wanted and 1.0 in self.best

    def to_dict(self) -> dict:
        return {
            "active": {str(b): sorted(ms) for b, ms in self.active.items()},
            "best": {str(b): m for b, m in self.best.items()},
            "untuned": {str(b): why for b, why in self.untuned.items()},
        }


def successive_halving(first: Sequence[float], widen: int, loss_at: LossAt) -> SweepState:
    """Walk the budgets in order as far as the known points allow; the rest is `wanted`."""
    state = SweepState()
    low, high = min(first) / 2**widen, max(first) * 2**widen
    active = sorted(set(first))
    for budget in BUDGETS:
        while True:
            missing = [(m, budget) for m in active if loss_at(m, budget) is None]
            if missing:
                state.active[budget] = list(active)
                state.wanted = missing
                return state
            best = min(active, key=lambda m: (loss_at(m, budget), m))
            side = _open_side(best, budget, active, loss_at)
            if side is None:
                break
            neighbour = best / 2 if side == "below" else best * 2
            if not low <= neighbour <= high:
                state.untuned[budget] = (
                    f"its best rate x{best:g} is the {'lowest' if side == 'below' else 'highest'} tried "
                    f"after widening {widen} time(s) beyond the first grid"
                )
                break
            active = sorted({*active, neighbour})
        judged = {m for m in (best / 2, best * 2) if loss_at(m, budget) is not None}
        state.active[budget] = sorted({*active, *judged})  # a widened rate, however it was recorded
        state.best[budget] = best
        active = sorted({best, best / 2})
    return state


def _open_side(best: float, budget: float, active: Sequence[float], loss_at: LossAt) -> str | None:
    """Which side of `best` is not yet shown worse ("below", "above"), or None when it is interior."""
    here = loss_at(best, budget)
    below = loss_at(best / 2, budget) if best / 2 in active else None
    if below is None or below <= here:
        return "below"
    for shorter in (b for b in BUDGETS if b <= budget):
        above, mine = loss_at(best * 2, shorter), loss_at(best, shorter)
        if above is not None and mine is not None and above > mine:
            return None
    return "above"
