"""The statistics of a comparison: t intervals, paired tests with Holm's adjustment, equivalence, power, curves.

A sweep has a handful of seeds (3-8), so every interval uses Student's t with n-1 degrees of freedom
(``scipy.stats.t``), never a normal approximation that would be too narrow at n=3. Runs of two variants that share
a seed share their data order, so they are compared as pairs (a one-sample t on the per-seed differences, the
same as ``scipy.stats.ttest_rel``). Beside it, an exact sign-flip test that needs no normality and can take a
diverged run as the worst outcome.

The multiple-comparison functions take a matrix (one row per family) so that the calibration by simulation runs
the very code the report runs, vectorised.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import optimize, stats

from lit.statistics.paired_tests import (  # noqa: F401  (the report's names for them: stats.paired_t_p, ...)
    EXACT_SIGN_FLIP_MAX,
    MONTE_CARLO_FLIPS,
    paired_t_p,
    sign_flip_p_matrix,
)

MODES = ("min", "max")
BETTER, WORSE, UNRESOLVED = "better", "worse", "not distinguishable at this noise"
POWER = 0.8  # of the minimum detectable effect and of a plan
# The MDE and the plan read the sd of the paired differences at its one-sided upper confidence limit of this level,
# not at the observed sd: from 3 seeds the observed sd is below the true one half the time, and the plug-in MDE
# is then found with a mean power of 0.62 instead of 0.80 (docs/comparing-statistics.md, "Calibration").
SD_CONFIDENCE = 0.8
BOUNDED_CLIP = 1e-4  # a seed at exactly 0 or 1 is taken this far inside before the logit


@dataclass(frozen=True)
class Summary:
    """Mean of n values, with the sample std (ddof=1) and an interval of the mean when n >= 2."""

    n: int
    mean: float
    std: float | None
    interval: tuple[float, float] | None

    @property
    def half_width(self) -> float | None:
        return None if self.interval is None else (self.interval[1] - self.interval[0]) / 2


@dataclass(frozen=True)
class Paired:
    """Variant minus baseline over the seeds both finished: the mean difference, its (unadjusted) interval and the
    two-sided paired t-test. ``p_value`` is None below 2 pairs (one pair has no noise estimate) and when every
    difference is the same (zero spread: t is undefined, ``zero_spread`` says so; the sign-flip test still has its
    exact p)."""

    seeds: tuple[str, ...]
    differences: tuple[float, ...]
    summary: Summary | None
    p_value: float | None
    zero_spread: bool = False


def summarize(values: Sequence[float], confidence: float) -> Summary:
    """Mean, std (ddof=1) and t interval of the mean of ``values`` (at least one)."""
    array = np.asarray(values, dtype=float)
    if array.size == 0:
        raise ValueError("summarize needs at least one value")
    mean = float(array.mean())
    if array.size < 2:
        return Summary(1, mean, None, None)
    std = float(array.std(ddof=1))
    return Summary(int(array.size), mean, std, t_interval(mean, std / math.sqrt(array.size), array.size - 1,
                                                          confidence))


def summarize_bounded(values: Sequence[float], confidence: float) -> Summary:
    """Like ``summarize`` for a metric that lives in [0, 1] (an accuracy): the mean and std as measured, but the
    interval is a t interval on the logit scale mapped back, so it cannot leave (0, 1). A t interval on the raw
    scale puts a collapsed seed's spread symmetrically around the mean and crosses 100%. Seeds at exactly 0 or 1
    are taken ``BOUNDED_CLIP`` inside first."""
    plain = summarize(values, confidence)
    if plain.n < 2:
        return plain
    clipped = np.clip(np.asarray(values, dtype=float), BOUNDED_CLIP, 1 - BOUNDED_CLIP)
    logits = np.log(clipped / (1 - clipped))
    scale = summarize(logits, confidence)
    low, high = scale.interval
    return Summary(plain.n, plain.mean, plain.std, (float(_expit(low)), float(_expit(high))))


def _expit(x: float) -> float:
    return 1 / (1 + math.exp(-x)) if x >= 0 else math.exp(x) / (1 + math.exp(x))


def t_interval(center: float, standard_error: float, dof: int, confidence: float) -> tuple[float, float]:
    """The two-sided ``confidence`` interval ``center ± t_{dof} * standard_error``."""
    if standard_error == 0:  # identical values: scipy would answer nan for a zero scale
        return center, center
    low, high = stats.t.interval(confidence, dof, loc=center, scale=standard_error)
    return float(low), float(high)


def paired_difference(variant: Mapping[str, float], baseline: Mapping[str, float], confidence: float) -> Paired:
    """Variant - baseline, pairing values by seed (the keys); seeds only one side has are left out."""
    seeds = tuple(sorted(set(variant) & set(baseline), key=seed_order))
    differences = np.array([variant[s] - baseline[s] for s in seeds], dtype=float)
    if not seeds:
        return Paired(seeds, (), None, None)
    p_value, zero_spread = None, False
    if len(seeds) >= 2:
        p = float(paired_t_p(differences[None, :])[0])
        zero_spread = math.isnan(p)
        p_value = None if zero_spread else p
    return Paired(seeds, tuple(float(d) for d in differences), summarize(differences, confidence), p_value,
                  zero_spread)


def seed_correlation(variant: Mapping[str, float], baseline: Mapping[str, float],
                     seeds: Sequence[str]) -> float | None:
    """Pearson's correlation between the variant's and the baseline's values over ``seeds`` (the values, not
    their differences): how much seed noise the two runs of a seed share. The paired differences have std
    sqrt(sd_v^2 + sd_b^2 - 2 rho sd_v sd_b), so pairing helps when rho > 0 and costs when rho < 0. None below 3
    seeds (two points always correlate +-1) or when either side does not vary."""
    if len(seeds) < 3:
        return None
    v = np.array([variant[s] for s in seeds], dtype=float)
    b = np.array([baseline[s] for s in seeds], dtype=float)
    v, b = v - v.mean(), b - b.mean()
    scale = math.sqrt(float((v * v).sum() * (b * b).sum()))
    return float((v * b).sum() / scale) if scale > 0 else None


def sign_flip_p(differences: Sequence[float]) -> float | None:
    """The exact two-sided sign-flip (permutation) test of the paired differences, on their signed ranks (the
    Wilcoxon signed-rank statistic): under "no effect" each difference is as likely positive as negative, so the
    p-value is the share of the 2^n sign patterns whose |sum of signed ranks| is at least the observed one.
    Ranks make it exact whatever the distribution and let a diverged run enter as an infinite difference (the
    largest rank); ties get mid-ranks, and a zero difference (both runs equal, or both diverged) adds nothing.
    Its smallest possible p is 2 / 2^n (0.25 at 3 seeds). None without a pair."""
    d = np.asarray(differences, dtype=float)
    if d.size == 0:
        return None
    return float(sign_flip_p_matrix(d[None, :])[0])


def signed_rank_sum(differences: Sequence[float]) -> float:
    """The statistic of ``sign_flip_p``: its sign tells which way the outcomes lean."""
    d = np.nan_to_num(np.asarray(differences, dtype=float), nan=0.0)
    return float((np.sign(d) * stats.rankdata(np.abs(d))).sum()) if d.size else 0.0


def sign_flip_floor(n: int) -> float:
    """The smallest two-sided p the exact sign-flip test can give with n pairs: every sign the same, 2 / 2^n."""
    return 2.0 / 2.0**n


def sign_flip_decides_from(m: int, alpha: float) -> int:
    """The fewest pairs with which the exact sign-flip test can reject at all under Holm over m comparisons:
    its floor must fall below Holm's strictest level, 2 / 2^n < alpha / m (10 pairs at m = 24, alpha 0.05)."""
    n = 1
    while sign_flip_floor(n) >= alpha / max(1, m):
        n += 1
    return n


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment: controls the chance of any false "better"/"worse" over the comparisons of a
    family (8 variants at p < 0.05 would otherwise call one in three noise a finding), and is never less powerful
    than Bonferroni. The adjusted p-values come back in the order given. A NaN p (a test that could not be
    computed) counts as 1, wherever it sits: it takes a place in the family and rejects nothing."""
    if len(p_values) == 0:
        return []
    return [float(p) for p in holm_matrix(np.asarray(p_values, dtype=float)[None, :])[0]]


def _adjust_sorted(p: np.ndarray, step) -> np.ndarray:
    """Apply ``step`` (ascending p-values of each row, and m -> adjusted values) with NaN counted as 1, and put the
    results back in each row's original order: the frame Holm and Benjamini-Hochberg share."""
    p = np.where(np.isnan(p), 1.0, p)
    order = np.argsort(p, axis=1, kind="stable")
    stepped = step(np.take_along_axis(p, order, axis=1), p.shape[1])
    adjusted = np.empty_like(stepped)
    np.put_along_axis(adjusted, order, stepped, axis=1)
    return adjusted


def holm_matrix(p: np.ndarray) -> np.ndarray:
    """``holm`` of each row."""
    return _adjust_sorted(p, lambda ranked, m: np.maximum.accumulate(
        np.minimum(1.0, (m - np.arange(m)) * ranked), axis=1))


def holm_levels(p_values: Sequence[float], alpha: float) -> list[float]:
    """The per-comparison level each comparison's interval is drawn at so that it excludes 0 exactly when Holm
    rejects it: alpha / (m - rank) for the comparisons Holm rejects, in the order it tests them; once Holm stops at
    a comparison, that comparison's level alpha / (m - rank) for it and every later (larger p) one. A t interval
    at level a excludes 0 exactly when the t-test's p < a, so the rejected ones exclude 0 and the others, whose p
    is at least the first unrejected p, include it. Each interval covers at its own level; all of them at once
    cover with probability >= 1 - alpha only at the Bonferroni level alpha / m (the first step's)."""
    p = np.where(np.isnan(np.asarray(p_values, dtype=float)), 1.0, np.asarray(p_values, dtype=float))
    m = len(p)
    levels = [0.0] * m
    stopped = None
    for rank, index in enumerate(np.argsort(p, kind="stable")):
        level = alpha / (m - rank) if stopped is None else stopped
        if stopped is None and p[index] >= level:
            stopped = level
        levels[int(index)] = level
    return levels


def benjamini_hochberg(p_values: Sequence[float]) -> list[float]:
    """Benjamini-Hochberg q-values: a screening column that controls the expected share of false findings among
    those called, not the chance of any; NaN counts as 1, as in ``holm``."""
    if len(p_values) == 0:
        return []
    return [float(q) for q in bh_matrix(np.asarray(p_values, dtype=float)[None, :])[0]]


def bh_matrix(p: np.ndarray) -> np.ndarray:
    """``benjamini_hochberg`` of each row."""
    return _adjust_sorted(p, lambda ranked, m: np.minimum(
        1.0, np.minimum.accumulate((ranked * m / np.arange(1, m + 1))[:, ::-1], axis=1)[:, ::-1]))


def tost_p(differences: np.ndarray, margin: float) -> np.ndarray:
    """Two one-sided t-tests of each row: p of "the mean difference lies inside (-margin, +margin)" (the larger of
    the two one-sided p-values; equivalence is shown at level alpha when it is below alpha, which is the 1 - 2 alpha
    interval lying inside the margin). NaN for a row with zero spread."""
    n = differences.shape[-1]
    mean = differences.mean(axis=-1)
    se = differences.std(axis=-1, ddof=1) / math.sqrt(n)
    with np.errstate(divide="ignore", invalid="ignore"):
        lower = stats.t.sf((mean + margin) / se, n - 1)  # H0: mean <= -margin
        upper = stats.t.cdf((mean - margin) / se, n - 1)  # H0: mean >= +margin
    return np.where(se > 1e-12 * np.maximum(1.0, np.abs(mean)), np.maximum(lower, upper), np.nan)


def power(effect: float, sd: float, n: int, alpha: float) -> float:
    """Power of the two-sided paired t-test at level ``alpha`` with n pairs whose differences have std ``sd``
    and mean ``effect`` (the noncentral t)."""
    return float(power_matrix(effect, sd, n, alpha))


def power_matrix(effect, sd, n, alpha: float) -> np.ndarray:
    """``power`` elementwise over arrays of effects, stds and numbers of pairs (broadcast together)."""
    n = np.asarray(n)
    dof = n - 1
    critical = stats.t.ppf(1 - alpha / 2, dof)
    shift = np.abs(effect) * np.sqrt(n) / sd
    # scipy's noncentral t answers NaN far out, where the power is 1 to float precision.
    far = shift > critical + 40
    shift = np.where(far, 0.0, shift)
    upper, lower = stats.nct.sf(critical, dof, shift), stats.nct.cdf(-critical, dof, shift)
    # The far tail below -critical is negligible for a positive shift, and scipy may answer NaN for it.
    return np.where(far, 1.0, np.nan_to_num(upper, nan=1.0) + np.nan_to_num(lower, nan=0.0))


def minimum_detectable_effect(sd: float | None, n: int, alpha: float, target: float = POWER) -> float | None:
    """The smallest paired mean difference the two-sided paired t-test at ``alpha`` finds with probability
    ``target``, given n pairs whose differences have std ``sd``. None below 2 pairs or without a spread."""
    if sd is None or n < 2 or not sd > 0:
        return None
    high = sd
    while power(high, sd, n, alpha) < target:
        high *= 2
    return float(optimize.brentq(lambda e: power(e, sd, n, alpha) - target, 0.0, high, xtol=1e-12 * sd))


def seeds_needed(effect: float, sd: float | None, alpha: float, target: float = POWER,
                 most: int = 10_000) -> int | None:
    """The fewest paired seeds with which the paired t-test at ``alpha`` finds ``effect`` with probability
    ``target``, differences having std ``sd``; None without a spread, or beyond ``most``."""
    if sd is None or not sd > 0 or effect == 0:
        return None
    n = 2
    while power(effect, sd, n, alpha) < target:
        n = n + 1 if n < 64 else int(n * 1.1)
        if n > most:
            return None
    if n > 64:  # the growth above overshoots: walk back to the fewest that suffice
        while n > 2 and power(effect, sd, n - 1, alpha) >= target:
            n -= 1
    return n


def seeds_needed_matrix(effect: float, sd: np.ndarray, alpha: float, target: float = POWER,
                        most: int = 10_000) -> np.ndarray:
    """``seeds_needed`` of each std in ``sd`` at once (NaN where it answers None), so that the calibration plans
    from thousands of simulated pilots with the function ``--plan`` runs. The walk starts at the normal
    approximation ((z_{1-alpha/2} + z_target) sd / effect)^2, a few seeds from the answer, and goes up while the
    power falls short, then back while one seed fewer still suffices (the power grows with n)."""
    sd = np.asarray(sd, dtype=float)
    usable = (sd > 0) & (effect != 0)
    z = stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(target)
    with np.errstate(divide="ignore", invalid="ignore"):
        start = np.ceil(np.nan_to_num((z * sd / abs(effect)) ** 2, nan=2.0, posinf=most + 1.0))
    n = np.maximum(2, np.minimum(start, most + 1)).astype(int)
    walking = usable & (n <= most)
    while walking.any():
        index = np.flatnonzero(walking)
        short = power_matrix(effect, sd[index], n[index], alpha) < target
        n[index[short]] += 1
        walking[index[~short]] = False
        walking &= n <= most
    walking = usable & (n > 2) & (n <= most)
    while walking.any():
        index = np.flatnonzero(walking)
        fewer = power_matrix(effect, sd[index], n[index] - 1, alpha) >= target
        n[index[fewer]] -= 1
        walking[index[~fewer]] = False
        walking &= n > 2
    return np.where(usable & (n <= most), n, np.nan)


def sd_upper_limit(differences: np.ndarray, confidence: float = SD_CONFIDENCE) -> np.ndarray:
    """The one-sided ``confidence`` upper confidence limit of the std of each row's paired differences (rows of
    n >= 2 values): the observed std (ddof=1) times sqrt((n-1) / chi2_{1-confidence, n-1}), which lies above
    the true std in ``confidence`` of samples of normal differences (at 80%: 2.12x the observed std at 3 seeds,
    1.46x at 6, 1.29x at 10). Each row from its own differences only: the comparisons of a sweep differ in how
    well their seeds pair (correlations from -0.9 to +0.97 in the text suite), so an sd pooled over them would be
    optimistic exactly for the noisiest rows, and rows that share the baseline's runs share its noise, so the
    pooled degrees of freedom would overstate what the pool knows."""
    d = np.asarray(differences, dtype=float)
    return d.std(axis=-1, ddof=1) * sd_limit_factor(d.shape[-1], confidence)


def sd_limit_factor(n: int, confidence: float = SD_CONFIDENCE) -> float:
    """``sd_upper_limit`` / the observed std at n values: sqrt((n-1) / chi2_{1-confidence, n-1})."""
    return math.sqrt((n - 1) / stats.chi2.ppf(1 - confidence, n - 1))


def detectable_effect(differences: np.ndarray, alpha: float, target: float = POWER) -> np.ndarray:
    """The MDE the report prints for each row of paired differences: ``minimum_detectable_effect`` at the row's
    ``sd_upper_limit`` (the MDE is proportional to the sd, so one MDE of a unit sd serves every row). NaN below 2
    pairs or without a spread."""
    d = np.asarray(differences, dtype=float)
    n = d.shape[-1]
    if n < 2:
        return np.full(d.shape[:-1], np.nan)
    sd = sd_upper_limit(d)
    return np.where(sd > 0, sd * minimum_detectable_effect(1.0, n, alpha, target), np.nan)


def planned_seeds(effect: float, differences: np.ndarray, alpha: float, target: float = POWER,
                  most: int = 10_000) -> np.ndarray:
    """``--plan``'s seeds for each row of paired differences (a pilot): ``seeds_needed`` at the row's
    ``sd_upper_limit``. NaN below 2 pairs, without a spread, or beyond ``most``."""
    d = np.asarray(differences, dtype=float)
    if d.shape[-1] < 2:
        return np.full(d.shape[:-1], np.nan)
    return seeds_needed_matrix(effect, sd_upper_limit(d), alpha, target, most)


def improvement(difference: float, mode: str) -> float:
    """A difference (variant - baseline) turned so that positive means better, whichever way the metric goes."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return -difference if mode == "min" else difference


def verdict(difference: float, p_adjusted: float, alpha: float, mode: str) -> str:
    """"better" or "worse" when the adjusted p is below ``alpha``, in the direction of ``mode``."""
    if not p_adjusted < alpha or difference == 0:
        return UNRESOLVED
    return BETTER if improvement(difference, mode) > 0 else WORSE


def reached(value: float, target: float, mode: str) -> bool:
    return value <= target if mode == "min" else value >= target


def step_reaching(steps: Sequence[float], values: Sequence[float], target: float, mode: str) -> float | None:
    """The first step at which the curve reaches ``target`` (its value at or better than it), linearly
    interpolated between the two logged points around that first crossing; on the raw curve, no best-so-far
    smoothing, so later noise back across it does not undo it. A curve already there at its first point answers
    that point's step; one that never gets there answers None."""
    for i, (step, value) in enumerate(zip(steps, values, strict=True)):
        if reached(value, target, mode):
            if i == 0:
                return float(step)
            step_before, value_before = steps[i - 1], values[i - 1]
            return float(step_before + (target - value_before) * (step - step_before) / (value - value_before))
    return None


@dataclass(frozen=True)
class CensoredMedian:
    """The median of per-seed values some of which are known only as upper bounds (right-censored steps make
    left-censored speedups), with a distribution-free interval for it. ``*_bounded``: the number is an upper
    bound only, because a censored value could lie below it."""

    median: float
    median_bounded: bool
    interval: tuple[float, float] | None  # None when n seeds cannot reach the level asked
    low_bounded: bool
    level: float  # the interval's coverage: at least the level asked (the most n allows when it is None)
    p_sign: float | None  # two-sided sign test of "above 1" against "below 1"; None when no seed is decided
    seeds_for_interval: int  # the fewest seeds whose order-statistic interval reaches the level asked


def censored_median(values: Sequence[float], bounds: Sequence[float], confidence: float) -> CensoredMedian | None:
    """Exact ``values`` and censored ones known only to be <= their ``bounds``, summarised without dropping the
    censored ones (dropping them keeps only the seeds that did well: the bias the statistics review measured).

    The interval is the order-statistic interval for a median, [x_(k), x_(n-k+1)], with binomial coverage
    1 - 2 P(Bin(n, 1/2) <= k - 1): the largest k that reaches ``confidence``; with too few seeds to reach it even
    at k = 1 (75% at 3 seeds; 95% needs 6) there is none, rather than a narrower one read as if it were 95%.
    Censored values sit at their bounds; since a true value can only be
    lower, the upper end stays valid, and the lower end (and the median) is exact only when no censored value
    sits at or above its position, else it is printed as an upper bound. The sign test counts a seed above 1
    (faster) against one below 1 or censored at a bound <= 1 (slower); a censored bound above 1 decides nothing."""
    points = sorted([(float(v), False) for v in values] + [(float(b), True) for b in bounds])
    n = len(points)
    if n == 0:
        return None
    k = 1
    while k + 1 <= (n + 1) // 2 and 1 - 2 * stats.binom.cdf(k, n, 0.5) >= confidence:
        k += 1
    level = float(1 - 2 * stats.binom.cdf(k - 1, n, 0.5)) if n > 1 else 0.0
    censored_at_or_above = [any(c for _, c in points[i:]) for i in range(n)]
    middle = (n - 1) // 2  # the lower middle: the median is exact when nothing censored sits at or above it
    median = float(np.median([v for v, _ in points]))
    faster = sum(v > 1 for v, c in points if not c)
    slower = sum(v < 1 for v, c in points if not c) + sum(v <= 1 for v, c in points if c)
    p_sign = float(stats.binomtest(faster, faster + slower, 0.5).pvalue) if faster + slower else None
    interval = (points[k - 1][0], points[n - k][0]) if level >= confidence else None
    enough = 2
    while 1 - 2 * 0.5 ** enough < confidence:
        enough += 1
    return CensoredMedian(median, censored_at_or_above[middle], interval, censored_at_or_above[k - 1], level,
                          p_sign, enough)


def last_values(points: pd.DataFrame) -> pd.DataFrame:
    """One value per (run_id, step): the latest logged, since a resumed run may log a step again."""
    return points.sort_values(["run_id", "step", "timestamp"], kind="stable").drop_duplicates(
        ["run_id", "step"], keep="last")


def final_value(points: pd.DataFrame) -> float:
    """The value at the last logged step of one run's history (``step``, ``timestamp``, ``value`` columns).
    The last step, not the best one: picking each run's best value would bias toward noisy variants."""
    ordered = points.sort_values(["step", "timestamp"], kind="stable")
    return float(ordered["value"].iloc[-1])


def mean_curve(points: pd.DataFrame) -> pd.DataFrame:
    """Mean and std (ddof=1, nan for one run) over runs at each step, from a history with ``run_id``, ``step``,
    ``timestamp``, ``value`` columns. Only the steps every run logged are kept: a mean over a changing set of
    seeds would jump where a seed drops out. Columns: step, mean, std, n."""
    by_step = last_values(points).pivot(index="step", columns="run_id", values="value").dropna()
    return pd.DataFrame({"step": by_step.index.to_numpy(dtype=float), "mean": by_step.mean(axis=1).to_numpy(),
                         "std": by_step.std(axis=1, ddof=1).to_numpy(), "n": by_step.shape[1]})


def seed_order(seed: str) -> tuple[int, float, str]:
    """Seeds sort as numbers when they are numbers (tags are strings: "10" comes after "9")."""
    try:
        return 0, float(seed), seed
    except ValueError:
        return 1, 0.0, seed

