"""Group-sequential decisions over declared looks: seeds are spent only where a question is still open.

A sequential sweep declares its looks up front (``--looks 3,6,9,12``: cumulative paired seeds, the last one the
maximum). At each look every open comparison is tested on the seeds it has; it stops when its boundary is crossed
(better or worse), when even the maximum seeds could not find the effect of interest (futility), or at the last
look. This module holds the rules, as pure functions of numbers, so the sweep (``lit/sweep/looks.py``), the report
and the calibration by simulation (``lit/compare/calibration.py``) run the very same code from this lower floor:

- **The boundary** spends alpha with the O'Brien-Fleming-type function in the Lan-DeMets form, symmetric in the
  two directions (half of alpha on each side, as ldbounds and gsDesign draw a two-sided design). Its critical
  values for a z statistic come from the Brownian-motion model of the looks by recursive numerical integration
  (Armitage, McPherson & Rowe; Jennison & Turnbull ch. 19). A Pocock-type function is here for comparison.
- **Small n.** Seeds come in 3s, so the test at a look is the paired t with n - 1 df, not a z. The boundary is
  applied as a *nominal p-value*: look k rejects when the look's own two-sided p is below 2 * (1 - Phi(c_k))
  (Jennison & Turnbull sec. 11.4, the significance-level approach). The t's p is exact at each look; the looks'
  dependence is the z model's only approximately, so the error rate is checked by simulation (the calibration).
  A look with a diverged run uses the exact sign-flip test instead, as ``compare`` does.
- **Multiplicity.** Holm within the family, group-sequentially: the closed test whose every intersection is a
  group-sequential Bonferroni test (each hypothesis of J spends alpha / |J| with the same function). Its shortcut
  is Holm's step-down on "has this comparison's statistic crossed its boundary at level alpha / j at some look
  it was tested at": a comparison rejected frees its share for the others, at this look and the next (Ye, Li, Liu
  & Yao 2013; Maurer & Bretz 2013; Tamhane et al. 2021 review the variants).
- **Futility** is non-binding: an open comparison stops when its conditional power at the last look, if the true
  mean difference were the larger of the declared effect of interest and the current estimate (either sign), falls
  below ``futility_power``; it is not checked at a look with fewer than 4 pairs (a 2-df sd). One absolute E
  serves every comparison of a family, so taking the drift from E alone stopped real effects of noisy comparisons
  (a true 3E found 79% of the time instead of 99%, statistics-review-3 D2). Stopping
  for futility only removes chances to reject, so the error rate can only fall; a comparison stopped for futility
  is never rejected later (it keeps its place in the family, which is conservative).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np
from scipy import optimize, stats

from lit.statistics.paired_tests import paired_t_p, sign_flip_p_matrix

OBRIEN_FLEMING, POCOCK = "obrien_fleming", "pocock"
ALPHA = 0.05
FUTILITY_POWER = 0.10  # stop an open comparison whose conditional power at max(E, |estimate|) is below this
FUTILITY_MIN_PAIRS = 4  # futility is not checked on fewer pairs: a 2-df sd makes the conditional power a guess
GRID = 801  # points of the numerical integration over a look's continuation region (odd, for Simpson's rule)
OPEN, REJECTED, FUTILE, RETAINED = 0, 1, 2, 3  # a comparison's state after a look
STATE_NAMES = {OPEN: "open", REJECTED: "rejected", FUTILE: "futile", RETAINED: "retained"}
T_TEST, SIGN_FLIP = "paired t", "sign-flip"  # as compare names them


def obrien_fleming(fraction: float, alpha: float) -> float:
    """Two-sided alpha spent by information ``fraction`` (Lan & DeMets 1983, the O'Brien-Fleming type), alpha / 2
    on each side: 2 * (2 - 2 Phi(z_{1 - alpha/4} / sqrt(t))). Almost nothing early, nearly all of it at the last
    look, so the last look's boundary is close to the fixed design's."""
    if fraction <= 0:
        return 0.0
    side = 2 * stats.norm.sf(stats.norm.isf(alpha / 4) / math.sqrt(min(fraction, 1.0)))
    return 2 * float(side)


def pocock(fraction: float, alpha: float) -> float:
    """Two-sided alpha spent by ``fraction`` with the Pocock-type function alpha * ln(1 + (e - 1) t): evenly spread,
    so early looks can stop more often and the last look pays for it (shown in the docs' table for comparison)."""
    return alpha * math.log(1 + (math.e - 1) * min(max(fraction, 0.0), 1.0))


SPENDING = {OBRIEN_FLEMING: obrien_fleming, POCOCK: pocock}


def _simpson(points: int, width: float) -> np.ndarray:
    weights = np.ones(points)
    weights[1:-1:2], weights[2:-1:2] = 4.0, 2.0
    return weights * width / (points - 1) / 3


@functools.lru_cache(maxsize=256)
def z_boundaries(fractions: tuple[float, ...], alpha: float, spending: str = OBRIEN_FLEMING) -> tuple[float, ...]:
    """The two-sided critical values c_k of a z statistic at information ``fractions`` (increasing, the last 1):
    P(no |Z_j| >= c_j before look k, |Z_k| >= c_k) = spent(t_k) - spent(t_{k-1}) under the null, with the looks'
    statistics a Brownian motion observed at t_k. Recursive integration of the sub-density of the score on a grid
    over the continuation region (where no boundary was crossed); ``math.inf`` where a look spends nothing."""
    spend = SPENDING[spending]
    bounds: list[float] = []
    grid = density = None
    spent_before, fraction_before = 0.0, 0.0
    for fraction in fractions:
        increment = spend(fraction, alpha) - spent_before
        spent_before += max(increment, 0.0)
        if grid is None:
            c = float(stats.norm.isf(increment / 2)) if increment > 0 else math.inf
            edge = min(c, 12.0) * math.sqrt(fraction)
            grid = np.linspace(-edge, edge, GRID)
            density = stats.norm.pdf(grid, scale=math.sqrt(fraction)) * _simpson(GRID, 2 * edge)
        else:
            step = math.sqrt(fraction - fraction_before)
            root = math.sqrt(fraction)

            def exits(c: float, grid=grid, density=density, step=step, root=root) -> float:
                return float(density @ (stats.norm.sf((c * root - grid) / step)
                                        + stats.norm.cdf((-c * root - grid) / step)))

            c = (float(optimize.brentq(lambda c, target=increment: exits(c) - target, 1e-9, 50.0, xtol=1e-10))
                 if increment > 0 else math.inf)
            edge = min(c, 12.0) * root
            new_grid = np.linspace(-edge, edge, GRID)
            kernel = stats.norm.pdf((new_grid[None, :] - grid[:, None]) / step) / step
            density = (density @ kernel) * _simpson(GRID, 2 * edge)
            grid = new_grid
        bounds.append(c)
        fraction_before = fraction
    return tuple(bounds)


@functools.lru_cache(maxsize=256)
def nominal_levels(looks: tuple[int, ...], alpha: float, spending: str = OBRIEN_FLEMING) -> tuple[float, ...]:
    """Per look, the two-sided nominal p-value below which that look rejects at overall level ``alpha``:
    2 * (1 - Phi(c_k)), with information in proportion to the paired seeds (t_k = n_k / n_K)."""
    fractions = tuple(n / looks[-1] for n in looks)
    return tuple(float(2 * stats.norm.sf(c)) for c in z_boundaries(fractions, alpha, spending))


REFERENCE_PATHS = 2 ** 20  # simulated null paths that fit the paired t's levels (Monte-Carlo error ~1% of alpha)
REFERENCE_SEED = 20_260_601
_CHUNK = 2 ** 16
_FLIP_ROWS = 512  # rows of sign-flip tests at once (each enumerates its 2^n sign patterns)
_FEWEST_EXITS = 50  # a look spending less than this many reference paths keeps its z-derived level


@functools.lru_cache(maxsize=8)
def _null_t_p(looks: tuple[int, ...]) -> np.ndarray:
    """The paired t's two-sided p at each look (rows) of ``REFERENCE_PATHS`` simulated null paths (columns): iid
    normal differences, a fixed seed, so every caller gets the same levels."""
    rng = np.random.default_rng(REFERENCE_SEED)
    p = np.empty((len(looks), REFERENCE_PATHS))
    for start in range(0, REFERENCE_PATHS, _CHUNK):
        x = rng.standard_normal((_CHUNK, looks[-1]))
        for k, n in enumerate(looks):
            p[k, start:start + _CHUNK] = paired_t_p(x[:, :n])
    return p


@functools.lru_cache(maxsize=1024)
def t_levels(looks: tuple[int, ...], alpha: float, spending: str = OBRIEN_FLEMING) -> tuple[float, ...]:
    """Per look, the nominal p-level of the paired t (n_k - 1 df) whose exits spend exactly the spending function's
    increments under the null.

    ``nominal_levels`` is exact for a z statistic; applied to the t's p it errs high at these sample sizes (the
    t's of successive looks are less correlated than the z's, since each look re-estimates the spread): 0.053
    instead of 0.05 at looks 3, 6, 9, 12, 0.0131 instead of 0.0125. So each level is re-fitted on a fixed
    reference set of null paths: at look k, the level below which exactly the increment's share of the paths
    that have not exited yet exits (the order statistic of their p). A look whose increment is below
    ``_FEWEST_EXITS`` reference paths (the first looks of an O'Brien-Fleming design at alpha / m) keeps the z's
    level, which there spends next to nothing."""
    z_levels = nominal_levels(looks, alpha, spending)
    p = _null_t_p(looks)
    alive = np.ones(p.shape[1], dtype=bool)
    spend, spent, levels = SPENDING[spending], 0.0, []
    for k, n in enumerate(looks):
        increment = spend(n / looks[-1], alpha) - spent
        spent += max(increment, 0.0)
        exits = int(round(increment * p.shape[1]))
        if exits < _FEWEST_EXITS:
            level = z_levels[k]
        else:
            ordered = np.partition(p[k, alive], (exits - 1, exits))
            level = float(0.5 * (ordered[exits - 1] + ordered[exits]))
        levels.append(level)
        alive &= ~(p[k] < level)
    return tuple(levels)


def critical_t(level: float, pairs: int) -> float:
    """The |t| that a paired t-test with ``pairs`` pairs needs for a two-sided p below ``level``."""
    return float(stats.t.isf(level / 2, pairs - 1)) if level > 0 and pairs >= 2 else math.inf


@dataclass(frozen=True)
class Plan:
    """A sequential design as the sweep declares it (the protocol's ``"sequential"``)."""

    looks: tuple[int, ...]  # cumulative paired seeds at each look, increasing, each >= 2; the last is the maximum
    alpha: float = ALPHA  # family-wise
    spending: str = OBRIEN_FLEMING
    effect_of_interest: float | None = None  # the mean paired difference worth finding, in the metric's units
    futility_power: float = FUTILITY_POWER

    @property
    def count(self) -> int:
        return len(self.looks)

    def levels(self, share: float) -> tuple[float, ...]:
        """Nominal p-levels per look for one hypothesis that spends ``share`` of alpha (alpha / j under Holm)."""
        return t_levels(self.looks, share, self.spending)

    def spent(self, look: int) -> float:
        """Two-sided alpha spent by look ``look`` (1-based), at the family's alpha."""
        return SPENDING[self.spending](self.looks[look - 1] / self.looks[-1], self.alpha)

    @property
    def futility_looks(self) -> tuple[int, ...]:
        """The looks (1-based) where the futility rule is checked: every look but the last with at least
        ``FUTILITY_MIN_PAIRS`` planned pairs (none without an effect of interest). Empty for looks 2, 4 or 3, 6."""
        if not self.effect_of_interest:
            return ()
        return tuple(k for k, n in enumerate(self.looks[:-1], start=1) if n >= FUTILITY_MIN_PAIRS)

    def futility_rule(self) -> str:
        """The futility rule in words, as the protocol records it and the report and the sweep's console print it:
        one text, so none of them can describe an older rule than ``decide`` runs."""
        if not self.effect_of_interest:
            return "no futility rule"
        rule = (f"non-binding futility: an open comparison stops when its conditional power at the last look, if "
                f"the true mean difference were ±max({self.effect_of_interest:g}, |its current estimate|), falls "
                f"below {self.futility_power:g}; checked at looks with at least {FUTILITY_MIN_PAIRS} paired seeds, "
                "never at the last look")
        checked = self.futility_looks
        if not checked:
            return (rule + f"; it cannot act with these looks (none before the last has {FUTILITY_MIN_PAIRS} paired "
                    "seeds)")
        return rule + f" (here at look{'s' if len(checked) > 1 else ''} {', '.join(map(str, checked))})"

    def to_json(self) -> dict:
        return {**asdict(self), "looks": list(self.looks), "multiplicity": "group-sequential Holm",
                "test": "paired t at n - 1 df against the nominal p-level of the look (sign-flip with a diverged run)",
                "futility": self.futility_rule() if self.effect_of_interest else "none"}

    @classmethod
    def from_json(cls, spec: Mapping) -> Plan:
        return cls(tuple(int(n) for n in spec["looks"]), float(spec.get("alpha", ALPHA)),
                   str(spec.get("spending", OBRIEN_FLEMING)),
                   None if spec.get("effect_of_interest") is None else float(spec["effect_of_interest"]),
                   float(spec.get("futility_power", FUTILITY_POWER)))


@dataclass(frozen=True)
class Evidence:
    """What each comparison's test gave at each look, arrays of shape (reps, comparisons, looks); NaN where a
    comparison was not tested at a look."""

    p: np.ndarray  # two-sided p of the look's test
    direction: np.ndarray  # sign of its statistic (the mean, or the signed-rank sum): +1 variant higher
    mean: np.ndarray  # of the finite paired differences
    sd: np.ndarray  # their std (ddof 1)
    pairs: np.ndarray  # paired seeds at the look (diverged ones included)
    t_tested: np.ndarray  # bool: the look's test is the paired t (else the sign-flip test)


def look_tests(differences: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(p, direction, t_tested) of each row of paired differences (rows of one length, ±inf for a diverged run):
    ``compare``'s rule, the paired t when every pair finished and the differences spread, else the exact
    sign-flip test on the signed ranks."""
    d = np.asarray(differences, dtype=float)
    finite = np.isfinite(d).all(axis=-1)
    with np.errstate(invalid="ignore"):
        p = paired_t_p(np.where(np.isfinite(d), d, 0.0))
    t_tested = finite & ~np.isnan(p)
    with np.errstate(invalid="ignore"):
        direction = np.sign(np.where(np.isfinite(d), d, 0.0).mean(axis=-1))
    flip = ~t_tested
    if flip.any():
        rows = d[flip]
        p[flip] = np.concatenate([sign_flip_p_matrix(rows[i:i + _FLIP_ROWS])
                                  for i in range(0, len(rows), _FLIP_ROWS)])  # 2^n patterns a row: in slices
        ranks = stats.rankdata(np.abs(np.nan_to_num(rows, nan=0.0)), axis=-1)
        direction[flip] = np.sign((np.sign(np.nan_to_num(rows, nan=0.0)) * ranks).sum(axis=-1))
    return p, direction, t_tested


def evidence(differences: np.ndarray, looks: Sequence[int]) -> Evidence:
    """The evidence of simulated comparisons whose every seed is known (reps, comparisons, max seeds): look k
    reads the first n_k."""
    reps, comparisons, _ = differences.shape
    shape = (reps, comparisons, len(looks))
    p, direction, mean, sd = (np.full(shape, np.nan) for _ in range(4))
    t_tested = np.zeros(shape, dtype=bool)
    for k, n in enumerate(looks):
        block = differences[..., :n]
        row_p, row_direction, row_t = look_tests(block.reshape(-1, n))
        p[..., k], direction[..., k] = row_p.reshape(reps, comparisons), row_direction.reshape(reps, comparisons)
        t_tested[..., k] = row_t.reshape(reps, comparisons)
        mean[..., k], sd[..., k] = _finite_moments(block)
    pairs = np.broadcast_to(np.asarray(looks, dtype=float), shape).copy()
    return Evidence(p, direction, mean, sd, pairs, t_tested)


def _finite_moments(block: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    finite = np.isfinite(block)
    count = finite.sum(axis=-1)
    values = np.where(finite, block, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = values.sum(axis=-1) / count
        sd = np.sqrt(np.where(finite, (values - mean[..., None]) ** 2, 0.0).sum(axis=-1) / (count - 1))
    return np.where(count >= 1, mean, np.nan), np.where(count >= 2, sd, np.nan)


def conditional_power(mean: np.ndarray, sd: np.ndarray, pairs: np.ndarray, most: int, effect,
                      critical: float) -> np.ndarray:
    """The chance that the last look (``most`` pairs, rejecting at |t| >= ``critical``) rejects, given the mean and
    std of the differences seen so far at ``pairs`` pairs, if the true mean difference were +``effect`` or
    -``effect`` (the larger of the two): the B-value form, B(t) = Z_t sqrt(t) and B(1) - B(t) ~ N(theta (1 - t),
    1 - t) with theta = effect sqrt(most) / sd (Lan & Wittes 1988), sd taken as observed. NaN without a spread."""
    with np.errstate(invalid="ignore", divide="ignore"):
        fraction = pairs / most
        z = mean / (sd / np.sqrt(pairs))
        b = z * np.sqrt(fraction)
        theta = np.asarray(effect) * math.sqrt(most) / sd
        rest = np.sqrt(np.maximum(1 - fraction, 1e-12))
        up = stats.norm.sf((critical - b - theta * (1 - fraction)) / rest)
        down = stats.norm.cdf((-critical - b + theta * (1 - fraction)) / rest)
    return np.where(sd > 0, np.maximum(up, down), np.nan)


@dataclass(frozen=True)
class Decisions:
    """The outcome of the looks so far for each (rep, comparison): arrays of shape (reps, comparisons), and per look
    ``states`` and ``powers`` (reps, comparisons, looks) and ``family_left`` (reps, looks)."""

    state: np.ndarray  # OPEN, REJECTED, FUTILE or RETAINED (the last look passed without a rejection)
    look: np.ndarray  # 1-based look at which it was settled; 0 while open
    share: np.ndarray  # the Holm share alpha / |J| in force when it was settled (the level its boundary used)
    crossing: np.ndarray  # 1-based look whose statistic crossed the boundary (rejected ones); 0 otherwise
    states: np.ndarray  # the state after each look
    powers: np.ndarray  # conditional power at each look where futility was checked (NaN elsewhere)
    family_left: np.ndarray  # |J| after each look's step-down: the hypotheses not rejected

    def pairs_used(self, plan: Plan) -> np.ndarray:
        """Paired seeds each comparison ran: those of the look it was settled at (the maximum while open)."""
        looks = np.asarray((plan.looks[-1],) + plan.looks)
        return looks[self.look]


def decide(found: Evidence, plan: Plan) -> Decisions:
    """Replay the looks so far (as many as ``found`` has) and decide each comparison: the group-sequential Holm
    step-down at every look, then non-binding futility for those still open, RETAINED at the last look. The
    family is every comparison in ``found`` (m of them), each spending alpha / |J| over the hypotheses J not yet
    rejected; a comparison's boundary at level alpha / j counts as crossed if its statistic crossed it at any look
    it was tested at (the closed test of group-sequential Bonferroni tests)."""
    reps, m, done = found.p.shape
    levels = np.array([[0.0] * plan.count] + [list(plan.levels(plan.alpha / j)) for j in range(1, m + 1)])
    last_critical = np.array([math.inf] + [critical_t(levels[j, -1], plan.looks[-1]) for j in range(1, m + 1)])
    crossed = np.zeros((reps, m, m + 1), dtype=int)  # first look (1-based) whose statistic crossed level alpha/j
    state = np.full((reps, m), OPEN)
    look, crossing = np.zeros((reps, m), dtype=int), np.zeros((reps, m), dtype=int)
    share = np.full((reps, m), np.nan)
    states, powers = np.zeros((reps, m, done), dtype=int), np.full((reps, m, done), np.nan)
    family_left = np.zeros((reps, done), dtype=int)
    rows = np.arange(reps)

    def left() -> np.ndarray:
        return m - (state == REJECTED).sum(axis=1)

    for k in range(done):
        with np.errstate(invalid="ignore"):
            now = (state == OPEN)[..., None] & (found.p[..., k, None] < levels[None, None, :, k])
        crossed = np.where((crossed == 0) & now, k + 1, crossed)
        while True:  # Holm's step-down: what crossed alpha / |J| is rejected, |J| shrinks, and again
            first = crossed[rows, :, left()]  # (reps, m): the look that crossed at this rep's alpha / |J|
            new = (state == OPEN) & (first > 0)
            if not new.any():
                break
            share = np.where(new, plan.alpha / np.maximum(left(), 1)[:, None], share)
            state = np.where(new, REJECTED, state)
            look = np.where(new, k + 1, look)
            crossing = np.where(new, first, crossing)
        remaining = np.maximum(left(), 1)
        if plan.effect_of_interest and k < plan.count - 1:
            # At the larger of E and the current estimate: an effect the data already show beyond E is not
            # stopped for lack of power at E. No check on a 2-df sd (3 pairs): it can be a third of the truth.
            effect = np.maximum(plan.effect_of_interest, np.abs(np.nan_to_num(found.mean[..., k])))
            cp = conditional_power(found.mean[..., k], found.sd[..., k], found.pairs[..., k], plan.looks[-1],
                                   effect, last_critical[remaining][:, None])
            cp = np.where(found.pairs[..., k] >= FUTILITY_MIN_PAIRS, cp, np.nan)
            powers[..., k] = np.where(state == OPEN, cp, np.nan)
            with np.errstate(invalid="ignore"):
                futile = (state == OPEN) & (cp < plan.futility_power)
            share = np.where(futile, plan.alpha / remaining[:, None], share)
            state = np.where(futile, FUTILE, state)
            look = np.where(futile, k + 1, look)
        if k == plan.count - 1:
            last = state == OPEN
            share = np.where(last, plan.alpha / remaining[:, None], share)
            state = np.where(last, RETAINED, state)
            look = np.where(last, k + 1, look)
        states[..., k] = state
        family_left[:, k] = left()
    return Decisions(state, look, share, crossing, states, powers, family_left)


@dataclass(frozen=True)
class ComparisonLooks:
    """One comparison's course through the looks of a sequential sweep, as the sweep records and compare reports
    it. ``p_values[k]`` is the p of its test at look k + 1 (None where it was not tested)."""

    label: str
    state: str  # "open", "rejected", "futile" or "retained" (not rejected at the last look)
    look: int  # the look it was settled at (1-based); 0 while open
    pairs: int  # paired seeds at its last look
    test: str  # the test of its last look: T_TEST or SIGN_FLIP
    p_values: tuple[float | None, ...]
    direction: int  # sign of variant - baseline at its last look (the mean, or the signed-rank sum)
    share: float  # the Holm share alpha / |J| its boundary used (in force at its last look while open)
    boundary_look: int  # the look whose boundary decided (the crossing look of a rejection; else its last look)
    boundary_p: float  # that boundary as a nominal p-level
    critical_t: float  # and as the |t| a paired t needs at the pairs that look tested (not the plan's n)
    conditional_power: float | None  # at its last look, where futility was checked
    mean: float = math.nan  # the mean paired difference at ``boundary_look``
    standard_error: float = math.nan  # and its standard error (sd / sqrt(n)); NaN where the test was the sign-flip

    @property
    def settled(self) -> bool:
        return self.state != STATE_NAMES[OPEN]

    @property
    def repeated_interval(self) -> tuple[float, float] | None:
        """The repeated confidence interval at the boundary that decided (or, unrejected, the last one it was tested
        against): mean +- |t needed| * SE at ``boundary_look``. It excludes 0 exactly when |t| reached the boundary,
        that is exactly when that look rejected (Jennison & Turnbull ch. 9); None for a sign-flip look."""
        if self.test != T_TEST or not math.isfinite(self.standard_error) or not math.isfinite(self.critical_t):
            return None
        half = self.critical_t * self.standard_error
        return self.mean - half, self.mean + half

    def to_json(self) -> dict:
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class SequentialResult:
    """A sequential sweep's decisions after ``looks_done`` looks."""

    plan: Plan
    looks_done: int
    comparisons: tuple[ComparisonLooks, ...]
    untestable: tuple[str, ...] = ()  # comparisons without 2 pairs at the first look: outside the family
    by_look: tuple[tuple[ComparisonLooks, ...], ...] = ()  # the comparisons as they stood after each look

    @property
    def open(self) -> list[str]:
        return [c.label for c in self.comparisons if not c.settled]

    @property
    def finished(self) -> bool:
        """Nothing left to look at: every comparison settled, or the last look done."""
        return not self.open or self.looks_done >= self.plan.count

    def look_record(self, look: int) -> dict:
        """What the sweep writes as ``looks/look_<k>.json`` for look ``look`` (1-based)."""
        plan, n = self.plan, self.plan.looks[look - 1]
        m = len(self.comparisons)
        first_level = plan.levels(plan.alpha / max(m, 1))[look - 1] if m else math.nan
        after = self.by_look[look - 1] if self.by_look else ()
        still_open = [c.label for c in after if not c.settled]
        return {"look": look, "of": plan.count, "seeds": n, "information_fraction": n / plan.looks[-1],
                "alpha": plan.alpha, "spending": plan.spending, "alpha_spent": plan.spent(look),
                "family_size": m, "first_step": {"share": plan.alpha / max(m, 1), "boundary_p": first_level,
                                                 "critical_t": critical_t(first_level, n)},
                "comparisons": [c.to_json() for c in after], "untestable": list(self.untestable),
                "open": still_open,
                "next_seeds": plan.looks[look] if still_open and look < plan.count else None}


def replay(outcomes: Mapping[str, Mapping[str, float]], seeds: Sequence[str], plan: Plan,
           looks_done: int) -> SequentialResult:
    """The decisions of a sequential sweep after ``looks_done`` looks, from its paired differences.

    ``outcomes``: per comparison, seed -> variant - baseline (±inf where one side diverged, 0 where both did);
    ``seeds``: the plan's seeds in order (look k reads the first ``plan.looks[k - 1]`` of them). The looks are
    replayed from the first, so the sweep at each look and ``compare`` afterwards reach the same decisions from
    the same runs."""
    looks_done = min(looks_done, plan.count)
    labels, untestable = [], []
    for label, by_seed in outcomes.items():
        (labels if sum(s in by_seed for s in seeds[:plan.looks[0]]) >= 2 else untestable).append(label)
    m = len(labels)
    shape = (1, m, looks_done)
    p, direction, mean, sd, pairs = (np.full(shape, np.nan) for _ in range(5))
    t_tested = np.zeros(shape, dtype=bool)
    for i, label in enumerate(labels):
        for k in range(looks_done):
            row = np.array([[outcomes[label][s] for s in seeds[:plan.looks[k]] if s in outcomes[label]]], float)
            if row.shape[1] < 2:
                continue
            row_p, row_direction, row_t = look_tests(row)
            p[0, i, k], direction[0, i, k], t_tested[0, i, k] = row_p[0], row_direction[0], row_t[0]
            mean[0, i, k], sd[0, i, k] = (float(x[0]) for x in _finite_moments(row))
            pairs[0, i, k] = row.shape[1]
    decisions = decide(Evidence(p, direction, mean, sd, pairs, t_tested), plan) if m else None
    moments = (mean, sd)
    by_look = tuple(tuple(_course(labels, i, k, plan, p, direction, pairs, t_tested, decisions, moments)
                          for i in range(m)) for k in range(looks_done))
    return SequentialResult(plan, looks_done, by_look[-1] if by_look else (), tuple(untestable), by_look)


def _course(labels, i, k, plan, p, direction, pairs, t_tested, decisions: Decisions,
            moments: tuple[np.ndarray, np.ndarray]) -> ComparisonLooks:
    """Comparison ``i`` as it stood after look ``k`` (0-based)."""
    state = int(decisions.states[0, i, k])
    settled_at = next((j for j in range(k + 1) if decisions.states[0, i, j] != OPEN), None)
    last = settled_at if settled_at is not None else k  # its last look tested (0-based)
    if state == REJECTED:
        share = float(decisions.share[0, i])
        boundary_look = int(decisions.crossing[0, i])
    else:
        share = plan.alpha / max(int(decisions.family_left[0, last]), 1)
        boundary_look = last + 1
    at = boundary_look - 1 if state == REJECTED else last  # a rejection's direction is its crossing's
    level = plan.levels(share)[boundary_look - 1]
    # The |t| the test at that look needed at the pairs it tested, not the plan's n: a comparison missing a seed
    # had fewer df, and its interval must exclude 0 exactly when its p crossed (statistics-review-4 F1).
    tested = pairs[0, i, boundary_look - 1]
    n = int(tested) if math.isfinite(tested) else 0
    computed = decisions.powers[0, i, :last + 1]
    power = computed[~np.isnan(computed)][-1] if (~np.isnan(computed)).any() else math.nan  # its latest
    return ComparisonLooks(
        label=labels[i], state=STATE_NAMES[state], look=0 if settled_at is None else settled_at + 1,
        pairs=int(pairs[0, i, last]) if not math.isnan(pairs[0, i, last]) else 0,
        test=T_TEST if t_tested[0, i, last] else SIGN_FLIP,
        p_values=tuple(None if j > last or math.isnan(p[0, i, j]) else float(p[0, i, j]) for j in range(k + 1)),
        direction=0 if math.isnan(direction[0, i, at]) else int(direction[0, i, at]),
        share=share, boundary_look=boundary_look, boundary_p=float(level), critical_t=critical_t(level, n),
        conditional_power=None if math.isnan(power) else float(power),
        mean=float(moments[0][0, i, boundary_look - 1]),
        standard_error=(float(moments[1][0, i, boundary_look - 1] / math.sqrt(pairs[0, i, boundary_look - 1]))
                        if t_tested[0, i, boundary_look - 1] else math.nan))
