"""The arena's protocol in one place: its rules and defaults as data, its decisions as pure functions.

Everything the judge decides is a small function of the record's numbers, here: the planner
(`plan.py`) asks these functions which runs it needs, the verdicts (`verdicts.py`) read the points with
them, and the report and the docs print `rules()` (docs/bench.md's table of rules is its output, checked
by a test). Changing a rule is changing one constant or one function of this module.

The rules, in the order a task meets them:

- **Budgets** `BUDGETS` of the full step budget, each a cooldown branch of `COOLDOWN` (`DECAY` shape)
  forked off one warmup-stable-decay trunk per rate (`budget.py` holds the geometry).
- **The race** (plain and every method alike): the first rates `FIRST_RATES` x the centre run to the first
  rung; at each rung of `RACE_RUNGS` the best (lowest eval loss) must be *interior* (the rate below it ran
  there and did worse, the rate above did worse there or at a shorter rung), else the grid widens by
  `SPACING` on the open side, at most `MAX_WIDENINGS` times a side, and an edge after that is *untuned*;
  the grid widens upwards only at the last rung (a shorter budget favours a larger rate, so a best at the
  top of a short rung says little about the full budget), and the rate above runs first at the first
  rung, where doing no better than the best closes that side for a quarter of the price (no better: a
  loss not lower by more than `Z` paired standard errors, as a larger rate that only ties on a short
  budget loses on a longer one);
  from one rung to the next go on the best and the rate below it; after the last rung the winner alone
  goes on to the full budget (its ¾ branch is plain's frontier point there).
- **The centre**: plain's is the base rate (the task's, the user's, or a range test's); a method's is
  plain's full-budget rate x its `rate_scale` (`ADAPTER_RATE_SCALE` for adapters replacing a full
  fine-tune: LoRA's rates sit about ten times higher).
- **The reading rule**, fixed before looking at any method: every verdict reads one budget, the full
  budget (`READ_AT`), or where plain's own frontier turns up the largest budget at its lowest loss
  (`reading_budget`, from plain's runs alone). Each seed's method run is paired with plain's run of that
  seed there; the mean eval-loss difference over the seeds is read on the first seed's plain frontier as
  a speed-up. A method stopped early is read at its own budget, against plain's point there.
- **Noise where it lives**: a speed-up's band joins the plain seeds' spread (run to run, read with
  Student's t at the seeds' degrees of freedom), a cluster bootstrap of the paired eval-loss difference
  over the eval set's documents (files, topics), the budget grid's interpolation error, the calibrated
  price's error and the frontier slope's own error; the interval is t at the parts' Welch-Satterthwaite
  degrees of freedom, two-sided at `CONFIDENCE` a side. A task's *resolution* is that band for two
  equally good methods: the smallest speed-up its judge can tell from 1.0x.
- **Verdicts**: wins above the band, loses below it, ties inside; unresolved when the band misses its
  seed part (one plain seed) and the reading lies outside the rest; untuned when either side's rate sits
  at an edge. A method below the band's square at `EARLY_STOP_AT` stops there and loses (untuned if its
  race ended at an edge).
- **Other seeds** of a method run only where they can change its verdict.
- **Same-trajectory methods** (compilers, fused kernels, padding removed) run `SAME_TRAJECTORY_BUDGET` of
  the budget at plain's rate: if their eval loss there is plain's within the eval clusters' noise (or the
  resolution) they are judged in time, else raced as any other method. A time verdict reads
  `TIMED_PAIRS` interleaved pairs of timed runs (plain, method, plain, method, ... in one stage of one
  invocation): the mean log time ratio with its t interval; a win or a loss only outside it.
- **The schedule check**: a run of `SCHEDULE_CHECK_AT` of the budget in the task's own schedule at plain's
  rate there, against the trunk's branch of that budget; a trunk worse than it by more than `Z` paired
  standard errors sends every run to separate runs in that schedule.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

# ---- the rules' constants ------------------------------------------------------------------------------

BUDGETS = (0.25, 0.5, 0.75, 1.0)
COOLDOWN = 0.2
DECAY = "1-sqrt"
FIRST_RATES = (0.5, 1.0, 2.0)
SPACING = 2.0
MAX_WIDENINGS = 2
RACE_RUNGS = (0.25, 0.5)
READ_AT = 1.0
EARLY_STOP_AT = 0.5
Z = 2.0
BOOTSTRAP_DRAWS = 2000
BOOTSTRAP_SEED = 0
ADAPTER_RATE_SCALE = 10.0
SAME_TRAJECTORY_BUDGET = 0.25
SCHEDULE_CHECK_AT = 0.5  # half a full run; its trunk branch is already run (at 1/4 no verdict reads it)
TARGET_RESOLUTION = 1.15
CONFIDENCE = (
    0.975  # each side of a two-sided 95% interval: a null reads a false win (or loss) 2.5% of the time
)
MAX_SEEDS = 40  # the most seeds the judge would advise
TIMED_PAIRS = 5  # interleaved timed runs of each side that a time verdict reads
EVAL_FACTORS = (2.0, 3.0, 4.0, 6.0, 10.0)  # the eval sets a task could grow to, x today's clusters
SCHEDULE = "wsd"

# verdict words
WINS, LOSES, TIES, UNRESOLVED, UNTUNED = "wins", "loses", "ties", "unresolved", "untuned"

# (rate, budget) -> the eval loss of that point, or None while it has not run
LossAt = Callable[[float, float], "float | None"]
# (rate, other rate, budget) -> the paired standard error of their eval-loss difference there (inf: unknown)
PairedSE = Callable[[float, float, float], float]


@dataclass(frozen=True)
class Protocol:
    """The settings one arena runs with (the flags of `hf-hybrid bench`); every default is a rule's."""

    seeds: Sequence[int] = (0,)
    lr_multipliers: Sequence[float] = field(default_factory=lambda: FIRST_RATES)  # the first grid
    widen: int = field(default_factory=lambda: MAX_WIDENINGS)
    cooldown: float = field(default_factory=lambda: COOLDOWN)
    decay: str = field(default_factory=lambda: DECAY)
    schedule: str = field(default_factory=lambda: SCHEDULE)
    schedule_check: bool = True
    warm_steps: int = 2
    timed_steps: int = 8


# ---- the race ------------------------------------------------------------------------------------------


@dataclass
class Race:
    """What the race of one method (plain included) has decided, and the points it still needs."""

    rungs: dict[float, list[float]] = field(default_factory=dict)  # rung -> the rates judged there
    best: dict[float, float] = field(default_factory=dict)  # budget -> its rate (after the rungs: the winner)
    untuned: dict[float, str] = field(default_factory=dict)  # rung -> why its best sits at an edge
    wanted: list[tuple[float, float]] = field(default_factory=list)  # (rate, budget) to run next

    @property
    def decided(self) -> bool:
        """The last rung is judged: the full budget's rate is known."""
        return RACE_RUNGS[-1] in self.best

    @property
    def rate(self) -> float | None:
        return self.best.get(READ_AT)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rungs": {str(b): sorted(rates) for b, rates in self.rungs.items()},
            "best": {str(b): r for b, r in self.best.items()},
            "untuned": {str(b): why for b, why in self.untuned.items()},
        }


def first_grid(centre: float, first: Sequence[float] | None = None) -> list[float]:
    """The rates every race starts from: `FIRST_RATES` (or `first`) x the centre."""
    return sorted(centre * f for f in (first or FIRST_RATES))


def carried(best: float) -> list[float]:
    """What goes on from one rung to the next: the best and the rate below it (a longer budget's best
    rate is rarely larger than a shorter one's: the short-horizon bias)."""
    return [best / SPACING, best]


def open_side(best: float, rung: float, loss_at: LossAt, paired_se: PairedSE | None = None) -> str | None:
    """Which side of `best` is not yet shown worse ("below", "above"), or None when it is interior: the
    rate below ran at this rung and did worse, the rate above did no better here or at a shorter rung
    (a tie goes to the smaller rate, so an equal rate above closes the side: the optimum lies between;
    at a shorter rung, within `Z` paired standard errors is equal)."""
    here = loss_at(best, rung)
    below_loss = loss_at(best / SPACING, rung)
    if below_loss is None or below_loss <= here:
        return "below"
    for shorter in (b for b in RACE_RUNGS if b <= rung):
        above, mine = loss_at(best * SPACING, shorter), loss_at(best, shorter)
        if above is None or mine is None:
            continue
        margin = Z * paired_se(best * SPACING, best, shorter) if paired_se and shorter < rung else 0.0
        if above >= mine - margin:
            return None
    return "above"


def race(
    grid: Sequence[float], loss_at: LossAt, widen: int | None = None, paired_se: PairedSE | None = None
) -> Race:
    """Walk the rungs in order as far as the known points allow; what is missing is `wanted`. The lowest
    eval loss wins a rung (the smaller rate on a tie). The race reads only the points it asked for, so a
    record holding more (an earlier rule's runs) is read as a fresh race would be, and costs as much.
    `paired_se`: the noise within which a larger rate ties at a shorter rung (None: exact ties only)."""
    widen = MAX_WIDENINGS if widen is None else widen
    state = Race()
    low, high = min(grid) / SPACING**widen, max(grid) * SPACING**widen

    def asked(rate: float, budget: float) -> float | None:
        if not any(math.isclose(rate, r) for r in state.rungs.get(budget, ())):
            return None
        return loss_at(rate, budget)

    active = sorted(set(grid))
    for rung in RACE_RUNGS:
        while True:
            state.rungs[rung] = list(active)
            missing = [(r, rung) for r in active if loss_at(r, rung) is None]
            if missing:
                state.wanted = missing
                return state
            best = min(active, key=lambda r: (loss_at(r, rung), r))
            side = open_side(best, rung, asked, paired_se)
            if side is None or (side == "above" and rung != RACE_RUNGS[-1]):
                break  # a shorter budget favours a larger rate: the rate above is tried at the last rung
            neighbour = best / SPACING if side == "below" else best * SPACING
            if not low * (1 - 1e-9) <= neighbour <= high * (1 + 1e-9):
                state.untuned[rung] = (
                    f"its best rate x{best:g} is the {'lowest' if side == 'below' else 'highest'} tried "
                    f"after {widen} widening(s) beyond the first grid"
                )
                break
            first = state.rungs[RACE_RUNGS[0]]
            has_shorter = rung != RACE_RUNGS[0]
            if side == "above" and has_shorter and not any(math.isclose(neighbour, r) for r in first):
                first.append(neighbour)  # first at the shortest rung: worse there closes the side cheaply
                if loss_at(neighbour, RACE_RUNGS[0]) is None:
                    state.wanted = [(neighbour, RACE_RUNGS[0])]
                    return state
                continue
            active = sorted({*active, neighbour})
        state.best[rung] = best
        active = carried(best)
    for rung in RACE_RUNGS[:-1]:  # the frontier's point there: the best of all the race ran there
        state.best[rung] = min(state.rungs[rung], key=lambda r: (loss_at(r, rung), r))
    winner = state.best[RACE_RUNGS[-1]]
    for budget in (b for b in BUDGETS if b > RACE_RUNGS[-1]):
        state.best[budget] = winner
    return state


# ---- noise and resolution ------------------------------------------------------------------------------


def cluster_bootstrap_se(
    diffs: Sequence[float], clusters: Sequence[int] | None = None, weights: Sequence[float] | None = None
) -> float:
    """The standard error of a weighted mean difference over an eval set whose examples come in clusters
    (documents, files): clusters resampled with replacement, `BOOTSTRAP_DRAWS` times, a fixed seed.
    Examples of one document move together, so resampling examples would understate the error.
    numpy is imported here: the CLI's `--help` reads this module's constants and must load no
    third-party library."""
    import numpy as np

    d = np.asarray(diffs, dtype=np.float64)
    if d.size < 2:
        return math.inf
    w = np.ones_like(d) if weights is None else np.asarray(weights, dtype=np.float64)
    ids = np.arange(d.size) if clusters is None else np.unique(np.asarray(clusters), return_inverse=True)[1]
    count = int(ids.max()) + 1
    if count < 2:
        return math.inf
    sums, totals = np.bincount(ids, w * d, count), np.bincount(ids, w, count)
    draws = np.random.default_rng(BOOTSTRAP_SEED).integers(0, count, size=(BOOTSTRAP_DRAWS, count))
    means = sums[draws].sum(axis=1) / totals[draws].sum(axis=1)
    return float(means.std(ddof=1))


def seed_variance(losses: Sequence[float]) -> float | None:
    """The run-to-run variance of plain's full-budget eval loss over its seeds (None with one seed)."""
    return statistics.variance(losses) if len(losses) >= 2 else None


def log_slope(frontier: Sequence[tuple[float, float]]) -> float:
    """How much plain's eval loss falls per e-fold of cost at the reading budget (between the frontier's
    last two points up to it): the exchange rate from a loss difference to a speed-up. Not positive (or a
    single point): the task no longer improves there, and no speed-up can be read."""
    if len(frontier) < 2:
        return 0.0
    (c0, l0), (c1, l1) = sorted(frontier)[-2:]
    return (l0 - l1) / math.log(c1 / c0)


def grid_error(frontier: Sequence[tuple[float, float]]) -> float:
    """The budget grid's interpolation error, in log cost: the chord from 1/2 to the full budget misses
    the 3/4 point by this much, and the grid reads between 3/4 and 1, half the spacing (a quarter of the
    error of a curve's chord)."""
    if len(dict(frontier)) < 3:
        return 0.0
    (c2, l2), (c3, l3), (c4, l4) = sorted(frontier)[-3:]
    if not l2 > l3 > l4:
        return 0.0
    chord = c2 + (c4 - c2) * (l2 - l3) / (l2 - l4)
    return abs(math.log(chord / c3)) / 4


# ---- quantiles: seeds and timings are few, so their parts are read with Student's t -------------------


def _continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (Lentz's method)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 300):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= c * d
        if abs(c * d - 1.0) < 1e-14:
            break
    return result


def _incomplete_beta(a: float, b: float, x: float) -> float:
    if x <= 0.0 or x >= 1.0:
        return min(max(x, 0.0), 1.0)
    front = math.exp(
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _continued_fraction(a, b, x) / a
    return 1.0 - front * _continued_fraction(b, a, 1.0 - x) / b


def t_cdf(value: float, df: float) -> float:
    """Student's t distribution function at `value` with `df` degrees of freedom (inf: the normal)."""
    if math.isinf(df):
        return statistics.NormalDist().cdf(value)
    tail = 0.5 * _incomplete_beta(df / 2.0, 0.5, df / (df + value * value))
    return 1.0 - tail if value > 0 else tail


def t_quantile(probability: float, df: float) -> float:
    """Student's t quantile (the normal's at infinite `df`); numpy and scipy are not needed for it."""
    normal = statistics.NormalDist().inv_cdf(probability)
    if math.isinf(df) or df > 1e6:
        return normal
    if not df > 0:
        return math.inf
    low, high = (normal, 1e4) if probability > 0.5 else (-1e4, normal)  # t's tails are the heavier
    while high - low > 1e-10 * max(1.0, abs(low)):
        middle = (low + high) / 2
        low, high = (middle, high) if t_cdf(middle, df) < probability else (low, middle)
    return (low + high) / 2


def effective_df(parts: Sequence[tuple[float, float]]) -> float:
    """The Welch-Satterthwaite degrees of freedom of a sum of variances, each `(variance, df)`: a part
    estimated from three seeds (2 df) dominates a sum of well-measured ones only as far as it is large."""
    total = sum(v for v, _ in parts)
    denominator = sum(v * v / df for v, df in parts if v > 0 and math.isfinite(df))
    return math.inf if denominator == 0 else total * total / denominator


# ---- the band ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Band:
    """A speed-up's band in log terms and where it comes from (each part a standard error)."""

    slope: float  # loss per e-fold of cost at the reading budget
    seed_se: float | None  # of the mean loss difference from run-to-run noise (None: one plain seed)
    eval_se: float  # of the mean loss difference from the eval set's clusters
    grid: float  # log cost
    price: float = 0.0  # log cost
    seed_df: float = math.inf  # of the plain seeds' variance: seeds - 1
    price_df: float = math.inf  # of the calibrated prices: timed steps - 1
    slope_se: float = 0.0  # of the slope, from the eval clusters of the two frontier points it joins
    shift: float = 0.0  # the loss difference read: the slope's error moves its reading by shift/slope

    @property
    def known(self) -> bool:
        return self.seed_se is not None and self.slope > 0

    def parts(self, with_seeds: bool = True) -> list[tuple[float, float]]:
        """(variance, degrees of freedom) of each part of the log speed-up."""
        parts = [
            ((self.eval_se / self.slope) ** 2, math.inf),
            (self.grid**2, math.inf),
            (self.price**2, self.price_df),
            ((self.shift * self.slope_se / self.slope**2) ** 2, math.inf),
        ]
        if with_seeds and self.seed_se is not None:
            parts.append(((self.seed_se / self.slope) ** 2, self.seed_df))
        return parts

    def df(self, with_seeds: bool = True) -> float:
        return effective_df(self.parts(with_seeds)) if self.slope > 0 else math.inf

    def half_width(self, with_seeds: bool = True) -> float:
        """A two-sided `1 - 2 (1 - CONFIDENCE)` interval of the log speed-up: Student's t at the
        parts' effective degrees of freedom (infinite where the loss no longer falls)."""
        if self.slope <= 0:
            return math.inf
        parts = self.parts(with_seeds)
        return t_quantile(CONFIDENCE, effective_df(parts)) * math.sqrt(sum(v for v, _ in parts))

    @property
    def resolution(self) -> float:
        """The smallest speed-up this band tells from 1.0x (the part it knows, with one plain seed)."""
        return math.exp(self.half_width(with_seeds=self.seed_se is not None))

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "df": self.df(self.seed_se is not None), "resolution": self.resolution}


def seed_se(variance: float | None, seeds: int) -> float | None:
    """The run-to-run part of the standard error of a mean loss difference over `seeds` paired seeds:
    each difference joins two runs, each with the plain runs' variance (conservative: pairing by seed
    only lowers it)."""
    return None if variance is None else math.sqrt(2 * variance / seeds)


def _with_seeds(band: Band, variance: float, seeds: int) -> Band:
    return replace(band, seed_se=seed_se(variance, seeds), seed_df=seeds - 1)


def seeds_for(band: Band, variance: float | None, target: float = TARGET_RESOLUTION) -> int | None:
    """The fewest seeds (plain's and the method's alike, so the variance then has seeds - 1 degrees of
    freedom) that bring `band` to `target`; None: no variance yet, or not within `MAX_SEEDS`."""
    if variance is None or band.slope <= 0:
        return None
    for seeds in range(2, MAX_SEEDS + 1):
        if _with_seeds(band, variance, seeds).resolution <= target:
            return seeds
    return None


def eval_factor_for(band: Band, target: float = TARGET_RESOLUTION) -> float | None:
    """How many times more eval clusters bring `band` to `target` with its seeds (None: more eval data
    alone cannot, within `EVAL_FACTORS[-1]`^2)."""
    if band.slope <= 0:
        return None

    def resolution(factor: float) -> float:
        return replace(band, eval_se=band.eval_se / math.sqrt(factor)).resolution

    low, high = 1.0, EVAL_FACTORS[-1] ** 2
    if resolution(low) <= target:
        return 1.0
    if resolution(high) > target:
        return None
    for _ in range(60):
        middle = math.sqrt(low * high)
        low, high = (middle, high) if resolution(middle) > target else (low, middle)
    return high


def seeds_and_eval_for(
    band: Band, variance: float | None, target: float = TARGET_RESOLUTION
) -> list[tuple[int, float]]:
    """Where neither more seeds nor more eval data alone bring `band` to `target`: (seeds, times the eval
    clusters) that do together, the fewest seeds for each of the first two factors that suffice."""
    found = []
    for factor in EVAL_FACTORS:
        seeds = seeds_for(replace(band, eval_se=band.eval_se / math.sqrt(factor)), variance, target)
        if seeds is not None:
            found.append((seeds, factor))
    return found[:2]


def price_error(errors: Mapping[str, float], kinds: Sequence[str], plain_kinds: Sequence[str]) -> float:
    """The log-cost error of a method's price against plain's: the timing errors of its own kinds and of
    plain's, joined (zero for a method whose steps are all of plain's kinds: the price cancels)."""
    own = [k for k in kinds if k not in plain_kinds]
    if not own:
        return 0.0
    parts = [errors.get(k, 0.0) for k in [*own, *plain_kinds]]
    return math.sqrt(sum(e * e for e in parts))


# ---- verdicts ------------------------------------------------------------------------------------------


def verdict(
    speedup: float, band: Band, untuned: str | None = None, stopped_at: float | None = None
) -> tuple[str, str]:
    """(word, reason) for a speed-up read at the full budget (or at `stopped_at`, where a method stopped
    early), against its band. An untuned race is never a win or a loss, even stopped early."""
    if not speedup > 0:
        return LOSES, "diverged"
    stop = f"stopped at {stopped_at:g}: below twice the band; " if stopped_at is not None else ""
    if untuned:
        return UNTUNED, f"{stop}{untuned}: a win or a loss would say as much about the tuning"
    word, reason = _against_band(math.log(speedup), band)
    if stopped_at is not None:
        return LOSES, f"stopped at {stopped_at:g}: below twice the band ({reason})"
    return word, reason


def _against_band(log: float, band: Band) -> tuple[str, str]:
    if band.slope <= 0:
        return UNRESOLVED, "plain's eval loss no longer falls at the full budget: no speed-up can be read"
    if not band.known:
        partial = band.half_width(with_seeds=False)
        if abs(log) <= partial:
            return TIES, f"within the eval and grid noise alone (±{math.exp(partial):.2f}x)"
        return UNRESOLVED, "the plain seeds' spread is unknown with one seed: run 2 or more seeds"
    width = band.half_width()
    text = f"the band {1 / math.exp(width):.2f}x–{math.exp(width):.2f}x"
    if log > width:
        return WINS, f"above {text}"
    if log < -width:
        return LOSES, f"below {text}"
    return TIES, f"within {text}"


def stops_early(speedup: float, band: Band) -> bool:
    """At `EARLY_STOP_AT` a method below twice its band (in log terms) is not worth its full runs."""
    return band.known and speedup > 0 and math.log(speedup) < -2 * band.half_width()


def more_seeds_can_change(speedup: float, one_seed: Band, all_seeds: Band) -> bool:
    """Whether a method's other seeds can change its one-seed verdict: it may win (above the band it would
    have with every seed) or may lose (between twice the one-seed band and the band with every seed,
    below 1). Far below, one seed already says `loses`; inside, more seeds would not leave the tie."""
    if not all_seeds.known:
        return False
    log = math.log(speedup) if speedup > 0 else -math.inf
    return log > all_seeds.half_width() or -2 * one_seed.half_width() <= log < -all_seeds.half_width()


def same_trajectory(speedup_at_short: float, resolution: float) -> bool:
    """A same-trajectory method's short run reads, in units, within the task's resolution of 1.0x."""
    return 1 / resolution <= speedup_at_short <= resolution


@dataclass(frozen=True)
class Timing:
    """A time ratio (plain's seconds over the method's) from interleaved timed pairs: the mean log ratio
    of the pairs and its t interval at `pairs - 1` degrees of freedom."""

    ratio: float
    low: float
    high: float
    pairs: int

    @property
    def df(self) -> int:
        return self.pairs - 1

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "df": self.df}


def timing(pairs: Sequence[tuple[float, float]]) -> Timing | None:
    """The `Timing` of `(plain seconds, method seconds)` pairs, each pair run side by side in one stage
    (None with fewer than two pairs: no spread, no interval). Pairing removes the load the two shared;
    the spread of the pairs is the noise left, read with t: two runs' max/min (the old rule) read a win
    between identical methods one time in four."""
    logs = [math.log(p / m) for p, m in pairs if p > 0 and m > 0]
    if len(logs) < 2:
        return None
    mean = statistics.fmean(logs)
    half = t_quantile(CONFIDENCE, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return Timing(math.exp(mean), math.exp(mean - half), math.exp(mean + half), len(logs))


def time_verdict(timed: Timing | None) -> tuple[str, str]:
    """A same-trajectory method's verdict: faster or slower only where its whole interval says so."""
    if timed is None:
        return UNRESOLVED, "fewer than two timed pairs"
    text = f"{timed.ratio:.2f}x, interval {timed.low:.2f}x-{timed.high:.2f}x over {timed.pairs} timed pairs"
    if timed.low > 1:
        return WINS, f"faster: {text}"
    if timed.high < 1:
        return LOSES, f"slower: {text}"
    return TIES, f"within the timing noise: {text}"


def reading_budget(frontier: Sequence[tuple[float, float]]) -> float:
    """The budget every verdict reads, from plain's frontier alone (budget, eval loss), fixed before
    any method is looked at: the full budget, or, where plain's own loss turns up, the largest budget at
    its lowest loss. An identity of plain then reads 1.0x wherever the curve turns (the full budget's
    loss read on an envelope that reached it earlier read it 0.55x)."""
    finite = [(b, loss) for b, loss in frontier if math.isfinite(loss)]
    if not finite:
        return READ_AT
    return min(finite, key=lambda point: (point[1], -point[0]))[0]


# ---- costs ---------------------------------------------------------------------------------------------


def in_plain_runs(units: float, plain_full_run: float) -> float:
    """Compute in plain full runs of the task (what a record's parts are costed in)."""
    return units / plain_full_run if plain_full_run > 0 else math.nan


# ---- the rules as the docs print them ------------------------------------------------------------------


def rules() -> list[tuple[str, str]]:
    """(rule, value) for docs/bench.md and every report: generated here, so they follow the constants."""
    rates = ", ".join(f"x{r:g}" for r in FIRST_RATES)
    centre = f"plain's full-budget rate (adapters replacing a full fine-tune: x{ADAPTER_RATE_SCALE:g})"
    band = (
        f"a two-sided {2 * CONFIDENCE - 1:.0%} t interval (Welch-Satterthwaite degrees of freedom) of: the "
        f"seeds (t at seeds - 1), the eval set's documents ({BOOTSTRAP_DRAWS} bootstrap draws), the grid, "
        "the price, the frontier's slope"
    )
    short = (
        f"a run of {SAME_TRAJECTORY_BUDGET:g} of the budget at plain's rate; within the eval noise of "
        f"plain's: judged in time on {TIMED_PAIRS} interleaved timed pairs of that budget (t interval of the "
        "mean log ratio)"
    )
    check_text = f"the task's own schedule against the trunk at {SCHEDULE_CHECK_AT:g} of the budget"
    return [
        ("budgets (fractions of the full budget)", ", ".join(f"{b:g}" for b in BUDGETS)),
        ("cooldown of each branch", f"{COOLDOWN:g} of its budget, {DECAY} decay"),
        ("first rates of every race (plain and methods)", f"{rates} of the centre"),
        ("rungs where rates are raced", ", ".join(f"{b:g}" for b in RACE_RUNGS)),
        ("carried from one rung to the next", f"the best and the rate below it (/{SPACING:g})"),
        ("after the last rung", "the winner alone, to the full budget"),
        (
            "widening while the best sits at an edge",
            f"x{SPACING:g} a step, at most {MAX_WIDENINGS} a side; upwards only at the last rung",
        ),
        (
            "the rate above the last rung's best",
            f"first at {RACE_RUNGS[0]:g}: no better there than the best (within {Z:g} paired standard "
            "errors) closes the side",
        ),
        ("a method's centre", centre),
        (
            "reading rule",
            f"every verdict at {READ_AT:g} of the budget (where plain's frontier turns up: the largest "
            "budget at its lowest loss), seeds paired, fixed from plain's runs before any method is read",
        ),
        ("band", band),
        ("early stop", f"at {EARLY_STOP_AT:g} of the budget, below twice the band"),
        ("same-trajectory methods", short),
        ("schedule check", check_text),
        ("target resolution of a built-in task", f"{TARGET_RESOLUTION:g}x at 3 seeds"),
    ]


def rules_markdown() -> str:
    lines = ["| rule | value |", "|---|---|"]
    lines += [f"| {rule} | {value} |" for rule, value in rules()]
    return "\n".join(lines)


DOCS_START, DOCS_END = "<!-- rules:start -->", "<!-- rules:end -->"


def write_docs(path: str) -> bool:
    """Put `rules_markdown()` between the markers of `path` (docs/bench.md); True when it changed."""
    with open(path, encoding="utf-8") as file:
        text = file.read()
    head, _, rest = text.partition(DOCS_START)
    _, _, tail = rest.partition(DOCS_END)
    new = f"{head}{DOCS_START}\n{rules_markdown()}\n{DOCS_END}{tail}"
    if new != text:
        with open(path, "w", encoding="utf-8") as file:
            file.write(new)
    return new != text


if __name__ == "__main__":  # python -m hf_hybrid.bench.protocol [docs/bench.md]: regenerate the table
    import sys

    write_docs(sys.argv[1] if len(sys.argv) > 1 else "docs/bench.md")
