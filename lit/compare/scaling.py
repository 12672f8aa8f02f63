"""Scaling laws and effective-compute multipliers from a ladder of runs, with a paired bootstrap interval.

A ladder trains every variant at several sizes (rungs), each with paired seeds. Per variant, final loss against
training compute is fitted by a saturating power law

    L(C) = E + A * C^(-alpha)

with the irreducible loss E shared by all variants (or pinned by the user), as architecture papers do when they
state a gain as a compute multiplier. A variant worth m times the baseline's compute has L_v(C) = L_b(m C), so
with a shared E the two laws differ in A (and in alpha when the gain changes with scale).

The effective-compute multiplier of a variant, at a compute C it reaches loss L, is the compute the baseline's
law needs to reach L, divided by C. It is read at every rung (L: the variant's mean loss there) and at a target
compute (L: the variant's law there). Above 1 the variant is worth more compute than it spends.

Fitting. For a given E, log(L - E) = log A - alpha log C is a straight line per variant, solved in closed form;
E is chosen on a grid (refined around its best point) to minimise the squared error of all variants in log
space, the space Hoffmann et al. fit in. Being closed-form, a fit costs microseconds, so the bootstrap refits
thousands of resampled ladders at once (arrays of shape (ladders, resamples, variants, rungs)).

Failures. A run that diverged has no final loss, and averaging a variant over the seeds that survived would
bias its multiplier upward (the survivors are its lucky seeds). So a (variant, rung) with any diverged seed is a
failure of that variant there: its survivors are not averaged into a point, the cell takes no part in any fit
(the shared E and exponent, the hold-out, the noise of the calibration), and the variant's multiplier there is
only an upper bound, the survivors' value (a divergence counts as no better than the variant's worst finished
seed, so its mean loss is at least the survivors' mean, and the multiplier falls as the loss rises). Its
multiplier at the target compute and its trend rest on its law over every rung: not estimable.

Uncertainty. Seeds pair across variants and rungs (seed i is the init and data-order seed of every run with
index i), so resampling draws seed indices with replacement and keeps every run of a drawn index together; the
fit is redone per resample. With the three to five seeds a CPU ladder affords, the percentile interval of so few
distinct resamples is too narrow; the interval is instead log m-hat +- t(n-1) * SE * sqrt(n / (n - 1)), SE the
bootstrap standard deviation of log m (a small-sample correction whose coverage ``calibrate`` measures by
simulation: ``python -m lit.compare.scaling``).
"""

from __future__ import annotations

import argparse
import math
import warnings
from dataclasses import dataclass

import numpy as np
from scipy import stats as scipy_stats

# A trend below this (the multiplier changing by 0.1% per e-fold of compute) is no trend, however narrow its
# interval: on noise-free data the interval has no width and rounding alone would otherwise flag one.
TREND_FLOOR = 1e-3
E_GRID = 16  # grid points for the shared irreducible loss, refined around the best (to 1/8192 of its range)


@dataclass(frozen=True)
class Ladder:
    """Final losses of a ladder: ``loss[v, r, s]`` for variant v, rung r, seed index s (NaN where missing).

    ``compute[v, r]``: the training FLOPs of variant v's runs at rung r (variants may spend different compute
    at one rung: a plugin that adds matrices adds FLOPs). Variant 0 is the baseline.

    ``diverged[v, r]``: how many of that cell's seeds diverged (their ``loss`` is NaN); any makes the cell a
    failure (see the module's "Failures").
    """

    variants: tuple[str, ...]
    compute: np.ndarray  # (V, R)
    loss: np.ndarray  # (V, R, S)
    diverged: np.ndarray | None = None  # (V, R) counts; None: none diverged

    def __post_init__(self):
        V, R = self.compute.shape
        if self.loss.shape[:2] != (V, R) or len(self.variants) != V:
            raise ValueError(f"shapes disagree: {len(self.variants)} variants, compute {self.compute.shape}, "
                             f"loss {self.loss.shape}")
        if self.diverged is not None and np.shape(self.diverged) != (V, R):
            raise ValueError(f"diverged has shape {np.shape(self.diverged)}, not {(V, R)}")
        if R < 3:
            raise ValueError(f"a scaling law needs at least 3 rungs, got {R}")

    @property
    def failed(self) -> np.ndarray:
        """(V, R) bool: the cells where a seed diverged."""
        if self.diverged is None:
            return np.zeros(self.compute.shape, dtype=bool)
        return np.asarray(self.diverged) > 0

    @property
    def counted_loss(self) -> np.ndarray:
        """``loss`` with every failed cell wholly missing: what the fits see (survivors are never averaged)."""
        return np.where(self.failed[..., None], np.nan, self.loss)


@dataclass(frozen=True)
class Laws:
    """Fitted laws, broadcast over leading dimensions (one per resample): E (...), A and alpha (..., V)."""

    E: np.ndarray
    A: np.ndarray
    alpha: np.ndarray

    def _params(self, v: int, trailing: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """E, A and alpha of variant v, with ``trailing`` axes added to broadcast against per-rung arrays."""
        expand = (...,) + (None,) * trailing
        return self.E[expand], self.A[..., v][expand], self.alpha[..., v][expand]

    def loss(self, compute: np.ndarray | float, v: int) -> np.ndarray:
        E, A, alpha = self._params(v, np.ndim(compute))
        return E + A * np.power(compute, -alpha)

    def compute_for(self, loss: np.ndarray, v: int) -> np.ndarray:
        """The compute variant v's law needs to reach ``loss`` (inf where it never does: loss <= E).

        ``loss`` has the laws' leading shape, optionally followed by one axis of rungs.
        """
        E, A, alpha = self._params(v, np.ndim(loss) - np.ndim(self.E))
        gap = loss - E
        with np.errstate(divide="ignore", invalid="ignore"):
            c = np.power(A / gap, 1.0 / alpha)
        return np.where(gap > 0, c, np.inf)


def _line_fits(x: np.ndarray, y: np.ndarray, common_slope: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Least-squares lines y = a_v + b_v x over rungs (last axis) for each variant (second to last), NaN-aware.

    With ``common_slope`` every variant shares one slope (its own intercept): the model of variants that differ
    by a constant compute multiplier. Returns intercepts (..., V), slopes (..., V) and the total squared error
    (...).
    """
    w = np.isfinite(y)
    if w.all():  # the common case, and the bootstrap's inner loop: no masking needed
        mx, my = x.mean(-1), y.mean(-1)
        dx, dy = x - mx[..., None], y - my[..., None]
    else:
        n = w.sum(-1)
        xw, yw = np.where(w, x, 0.0), np.where(w, y, 0.0)
        mx, my = xw.sum(-1) / n, yw.sum(-1) / n
        dx, dy = np.where(w, x - mx[..., None], 0.0), np.where(w, y - my[..., None], 0.0)
    sxy, sxx = (dx * dy).sum(-1), (dx * dx).sum(-1)
    b = np.broadcast_to((sxy.sum(-1) / sxx.sum(-1))[..., None], sxy.shape) if common_slope else sxy / sxx
    # The residuals are dy - b dx (both centred), so the squared error needs no second pass over the fit.
    sse = ((dy * dy).sum(-1) - 2 * b * sxy + b * b * sxx).sum(-1)
    return my - b * mx, b, sse


def fit_laws(log_compute: np.ndarray, mean_loss: np.ndarray, pinned_E: float | np.ndarray | None = None,
             common_alpha: bool = False) -> Laws:
    """Fit L = E + A C^-alpha per variant, E shared (or pinned), on mean losses of shape (..., V, R).

    ``log_compute``: natural log of compute, broadcastable to ``mean_loss``. ``common_alpha``: one exponent for
    all variants (they differ by a constant multiplier), else one each.
    """
    x = np.broadcast_to(log_compute, mean_loss.shape)
    if pinned_E is not None:
        E = np.broadcast_to(np.asarray(pinned_E, dtype=float), mean_loss.shape[:-2])
    else:
        floor = np.nanmin(mean_loss, axis=(-2, -1))  # E must stay below every observed loss
        E = _best_E(x, mean_loss, floor * 0.0, floor, common_alpha)
    a, b, _ = _line_fits(x, np.log(mean_loss - E[..., None, None]), common_alpha)
    return Laws(E=E, A=np.exp(a), alpha=-b)


def _best_E(x: np.ndarray, loss: np.ndarray, lo: np.ndarray, hi: np.ndarray, common_alpha: bool,
            refine: int = 4) -> np.ndarray:
    """The shared E in [lo, hi) minimising the total log-space squared error, by a grid refined ``refine`` times."""
    for _ in range(refine):
        fractions = np.linspace(0.0, 1.0, E_GRID, endpoint=False)
        grid = lo[..., None] + (hi - lo)[..., None] * fractions  # (..., K)
        gap = loss[..., None, :, :] - grid[..., :, None, None]  # (..., K, V, R)
        with np.errstate(invalid="ignore", divide="ignore"):
            _, _, sse = _line_fits(x[..., None, :, :], np.log(gap), common_alpha)
        k = np.nan_to_num(sse, nan=np.inf).argmin(-1)
        step = (hi - lo) / E_GRID
        best = lo + step * k
        lo, hi = np.maximum(lo, best - step), np.minimum(hi, best + step)
    return best


@dataclass(frozen=True)
class Multipliers:
    """Effective-compute multipliers of one variant against the baseline, with intervals."""

    variant: str
    per_rung: np.ndarray  # (R,) point estimates
    per_rung_interval: np.ndarray  # (R, 2)
    extrapolated: np.ndarray  # (R,) bool: the baseline never reached this loss; its law was extended to it
    at_target: float
    target_interval: tuple[float, float]
    target_compute: float
    trend: float  # slope of log(multiplier) against log(compute): 0 when the gain does not change with scale
    trend_interval: tuple[float, float]
    alpha: float  # the variant's own fitted exponent, at the shared fit's E (descriptive)
    alpha_baseline: float
    failed: np.ndarray  # (R,) bool: a seed diverged at this rung; per_rung is NaN there, upper_bound holds
    upper_bound: np.ndarray  # (R,) at a failed rung: the survivors' multiplier, an upper bound (NaN: none survived)

    @property
    def estimable(self) -> bool:
        """False when the variant failed at some rung: then at_target and trend are NaN (not estimable)."""
        return not bool(np.any(self.failed))

    @property
    def depends_on_scale(self) -> bool:
        """Whether the multiplier changes with compute (the exponents differ): then the trend is the answer."""
        lo, hi = self.trend_interval
        return self.estimable and (lo > 0 or hi < 0) and abs(self.trend) > TREND_FLOOR


def _per_rung(laws: Laws, mean_loss: np.ndarray, log_compute: np.ndarray, v: int) -> tuple[np.ndarray, np.ndarray]:
    """Variant v's log multiplier at each rung (..., R), and where it needed the baseline's law (R or ..., R).

    Where the baseline's own runs span variant v's mean loss, the compute it needs is read off the baseline's
    observed curve (made monotone) between its two neighbouring rungs, which assumes no law beyond the shared E;
    beyond its range its law (``laws``: the baseline's own exponent) extends it. The observed reading matters: a
    ladder pins E down poorly, and a law with the wrong E bends differently at different losses, which would show
    as a trend that is not there.

    Between two rungs the curve is interpolated linearly in log(L - E) against log compute: a power law's own
    shape, so a baseline that follows one is read exactly. Linear in L itself, the convex curve would be read
    high between rungs: 1% too much multiplier at rungs 2x apart, more at wider spacing.
    """
    E = laws.E[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        base = np.log(np.minimum.accumulate(mean_loss[..., 0, :], axis=-1) - E)  # more compute never hurts
        target = np.log(mean_loss[..., v, :] - E)
    x = log_compute[0]
    R = base.shape[-1]
    above = (base[..., None, :] > target[..., :, None]).sum(-1)  # baseline rungs still above v's loss
    inside = (above >= 1) & (above <= R - 1)
    j = np.clip(above - 1, 0, R - 2)
    b0, b1 = np.take_along_axis(base, j, -1), np.take_along_axis(base, j + 1, -1)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(b0 > b1, (b0 - target) / (b0 - b1), 0.0)
    interpolated = x[j] + t * (x[j + 1] - x[j])
    from_law = np.log(laws.compute_for(mean_loss[..., v, :], 0))
    return np.where(inside, interpolated, from_law) - log_compute[v], ~inside


def _at(laws: Laws, target: float, v: int) -> np.ndarray:
    """Variant v's multiplier at the target compute (...), from its law's loss there."""
    return laws.compute_for(laws.loss(target, v), 0) / target


def _slope(y: np.ndarray, x: np.ndarray, use: np.ndarray) -> np.ndarray:
    """Least-squares slope of y on x along the last axis, over the points ``use`` marks."""
    w = use.astype(float)
    mx = (w * x).sum(-1) / w.sum(-1)
    dx = np.where(use, x - mx[..., None], 0.0)
    return (dx * np.where(use, y, 0.0)).sum(-1) / (dx * dx).sum(-1)


def _seed_means(loss: np.ndarray, draws: np.ndarray | None) -> np.ndarray:
    """Mean over seeds of loss (..., V, R, S), for each row of seed-index draws (..., B, S): (..., B, V, R);
    without draws, (..., V, R). Leading axes (one per ladder) are shared by ``loss`` and ``draws``."""
    if draws is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a failed cell: every seed missing, NaN
            return np.nanmean(loss, axis=-1)
    picked = np.take_along_axis(loss[..., None, :, :, :], draws[..., :, None, None, :], axis=-1)  # (..., B, V, R, S)
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a resample whose every seed of a run is missing: NaN
        return np.nanmean(picked, axis=-1)


def _half_width(boot: np.ndarray, n: int, confidence: float, axis: int = 0) -> np.ndarray:
    """t(n-1) * sd(boot) * sqrt(n / (n-1)) along ``axis`` (the resamples), ignoring non-finite values.

    With n seeds the bootstrap's spread of a mean is the plug-in one (divisor n); sqrt(n / (n-1)) restores the
    unbiased standard error, and Student's t with n - 1 degrees of freedom widens it for the few seeds a ladder
    affords. Without both, 3 seeds give about 80% coverage of a nominal 95% interval."""
    finite = np.where(np.isfinite(boot), boot, np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        sd = np.sqrt(np.nanvar(finite, axis=axis, ddof=1))
    return scipy_stats.t.ppf(0.5 + confidence / 2, n - 1) * sd * math.sqrt(n / (n - 1))


@dataclass(frozen=True)
class _Estimates:
    """The estimates of one variant against the baseline, over a leading axis of ladders (L)."""

    log_m: np.ndarray  # (L, R)
    half_rung: np.ndarray  # (L, R)
    extrapolated: np.ndarray  # (L, R)
    log_at: np.ndarray  # (L,)
    half_at: np.ndarray  # (L,)
    trend: np.ndarray  # (L,)
    trend_half: np.ndarray  # (L,)
    depends: np.ndarray  # (L,) bool
    alpha: np.ndarray  # (L,) the variant's own exponent at the shared fit's E
    alpha_baseline: np.ndarray  # (L,)


def _estimate(loss: np.ndarray, compute: np.ndarray, target: float, pinned_E: float | None, draws: np.ndarray,
              confidence: float) -> list[_Estimates]:
    """Every non-baseline variant's estimates on ladders ``loss`` (L, V, R, S) sharing ``compute`` (V, R), with
    seed-index draws (L, B, S): the whole computation of ``multipliers``, for many ladders at once."""
    n = loss.shape[-1]
    log_c = np.log(compute)
    mean = _seed_means(loss, None)  # (L, V, R)
    boot_mean = _seed_means(loss, draws)  # (L, B, V, R)
    common, boot_common = (fit_laws(log_c, mean, pinned_E, common_alpha=True),
                           fit_laws(log_c, boot_mean, pinned_E, common_alpha=True))
    # Each variant's own exponent, with E fitted again under that model: when the exponents differ the
    # shared-exponent model is wrong and its E is biased (to 0 on a noise-free ladder whose exponents are 0.20
    # and 0.24), which would bias every exponent read at it.
    free, boot_free = (fit_laws(log_c, mean, pinned_E), fit_laws(log_c, boot_mean, pinned_E))
    out = []
    for v in range(1, loss.shape[1]):
        # Beyond the baseline's runs its own law extends its curve: the shared exponent would bend it towards the
        # variants' when they scale differently, and pull every extrapolated rung towards a multiplier of 1.
        log_m, extrapolated = _per_rung(free, mean, log_c, v)  # (L, R)
        boot_log_m, _ = _per_rung(boot_free, boot_mean, log_c, v)  # (L, B, R)
        read = ~extrapolated
        use = np.where((read.sum(-1) >= 3)[:, None], read, True)
        trend = _slope(log_m, log_c[v], use)
        trend_half = _half_width(_slope(boot_log_m, log_c[v], use[:, None, :]), n, confidence, axis=1)
        depends = np.abs(trend) > np.maximum(trend_half, TREND_FLOOR)
        log_at = np.where(depends, np.log(_at(free, target, v)), np.log(_at(common, target, v)))
        boot_log_at = np.where(depends[:, None], np.log(_at(boot_free, target, v)),
                               np.log(_at(boot_common, target, v)))
        out.append(_Estimates(log_m, _half_width(boot_log_m, n, confidence, axis=1), extrapolated, log_at,
                              _half_width(boot_log_at, n, confidence, axis=1), trend, trend_half, depends,
                              free.alpha[:, v], free.alpha[:, 0]))
    return out


def multipliers(ladder: Ladder, target_compute: float | None = None, pinned_E: float | None = None,
                resamples: int = 2000, confidence: float = 0.95, seed: int = 0) -> list[Multipliers]:
    """Every non-baseline variant's multiplier per rung and at ``target_compute`` (default: the largest rung's
    baseline compute), each with its paired-bootstrap interval, and its trend with scale.

    The law is fitted with one exponent shared by all variants (variants that differ by a constant multiplier):
    against a fit with one exponent each, that halves the estimate's spread and removes its bias when they do
    scale alike (``python -m lit.compare.scaling`` measures it). Whether they do is tested on the per-rung
    multipliers, without a law where the baseline's runs allow: the slope of log multiplier on log compute, over
    the rungs read off the baseline's observed curve (all rungs where fewer than three are). When that slope
    differs from 0, the multiplier at the target is read from each variant's own exponent instead, and the
    trend is the answer rather than one number.

    Failed cells (``ladder.diverged``) are missing from every fit; a failed variant's multiplier at a failed rung
    is NaN with the survivors' value as its upper bound, and its target multiplier and trend are NaN. A failed
    baseline is refused: it is every multiplier's yardstick.
    """
    n = ladder.loss.shape[-1]
    if n < 2:
        raise ValueError("an interval needs at least 2 seeds per run")
    failed = ladder.failed
    if failed[0].any():
        raise ValueError(f"the baseline {ladder.variants[0]!r} diverged at rung(s) "
                         f"{', '.join(map(str, np.flatnonzero(failed[0])))}: no multiplier is estimable against it")
    target = float(target_compute if target_compute is not None else ladder.compute[0, -1])
    draws = np.random.default_rng(seed).integers(0, n, size=(1, resamples, n))
    counted = ladder.counted_loss
    survivors = _seed_means(ladder.loss, None)  # the failed cells' survivors: read only for their bounds
    free = fit_laws(np.log(ladder.compute), _seed_means(counted, None), pinned_E) if failed.any() else None
    out = []
    for v, e in enumerate(_estimate(counted[None], ladder.compute, target, pinned_E, draws, confidence), 1):
        log_m, half_rung, half_at = e.log_m[0], e.half_rung[0], float(e.half_at[0])
        log_at, trend, trend_half = float(e.log_at[0]), float(e.trend[0]), float(e.trend_half[0])
        bound = np.full(len(log_m), np.nan)
        if failed[v].any():
            # The same reading, at the fit without the failed cells, of the survivors' mean: the loss can only be
            # higher than that, and the multiplier only lower.
            read, _ = _per_rung(free, survivors, np.log(ladder.compute), v)
            bound = np.where(failed[v], np.exp(read), np.nan)
            log_m = np.where(failed[v], np.nan, log_m)
            half_rung = np.where(failed[v], np.nan, half_rung)
            log_at = trend = trend_half = half_at = float("nan")
        out.append(Multipliers(
            variant=ladder.variants[v], per_rung=np.exp(log_m),
            per_rung_interval=np.stack([np.exp(log_m - half_rung), np.exp(log_m + half_rung)], axis=-1),
            extrapolated=e.extrapolated[0], at_target=float(np.exp(log_at)),
            target_interval=(float(np.exp(log_at - half_at)), float(np.exp(log_at + half_at))),
            target_compute=target, trend=trend, trend_interval=(trend - trend_half, trend + trend_half),
            alpha=float(e.alpha[0]), alpha_baseline=float(e.alpha_baseline[0]), failed=failed[v].copy(),
            upper_bound=bound))
    return out


def holdout_error(ladder: Ladder, pinned_E: float | None = None) -> np.ndarray:
    """Out-of-sample check: fit without the largest rung, predict each variant's mean loss there.

    Returns predicted minus observed, per variant (V,), NaN for a variant that failed at the largest rung. Needs
    at least 4 rungs (3 to fit); failed cells take no part.
    """
    if ladder.compute.shape[1] < 4:
        raise ValueError("the hold-out check needs at least 4 rungs: 3 to fit, 1 to predict")
    mean = _seed_means(ladder.counted_loss, None)
    laws = fit_laws(np.log(ladder.compute[:, :-1]), mean[:, :-1], pinned_E)
    predicted = np.array([laws.loss(ladder.compute[v, -1], v) for v in range(len(ladder.variants))])
    return predicted - mean[:, -1]


def holdout_check(ladder: Ladder, pinned_E: float | None = None, resamples: int = 2000, confidence: float = 0.95,
                  seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``holdout_error`` with a prediction interval: (errors (V,), half-widths (V,)).

    The half-width combines the spread of the prediction over paired seed resamples (the fit redone on each) and
    the standard error of the observed mean at the held-out rung, t-corrected as the multipliers are: an error
    inside it is what seed noise alone would give."""
    error = holdout_error(ladder, pinned_E)
    n = ladder.loss.shape[-1]
    if n < 2:
        return error, np.full_like(error, np.nan)
    draws = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    loss = ladder.counted_loss
    boot = _seed_means(loss, draws)  # (B, V, R)
    laws = fit_laws(np.log(ladder.compute[:, :-1]), boot[..., :-1], pinned_E)
    predicted = np.stack([laws.loss(ladder.compute[v, -1], v) for v in range(len(ladder.variants))], axis=-1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        spread = np.nanvar(np.where(np.isfinite(predicted), predicted, np.nan), axis=0, ddof=1) * n / (n - 1)
        observed = np.nanvar(loss[:, -1, :], axis=-1, ddof=1) / np.isfinite(loss[:, -1, :]).sum(-1)
    t = scipy_stats.t.ppf(0.5 + confidence / 2, n - 1)
    return error, t * np.sqrt(spread + observed)


# --- calibration by simulation ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class TrueLaw:
    """The law a simulated baseline follows, and the seed noise of one run.

    The noise is the seed spread this project measured: the 8-layer tinyshakespeare baseline's final validation
    loss over seeds has a standard deviation of 0.0076 (docs/reproduction.md), at about 3.2e12 training FLOPs
    (1.72M parameters, 307k tokens) and a loss of 1.977. The shape is an assumption stated here: the ladder spans
    16x compute around that run, and loss falls 0.07 nats per doubling of compute there (alpha = 0.2).
    """

    E: float = 1.472
    A: float = 159.8
    alpha: float = 0.2
    noise_sd: float = 0.0076
    # Correlation of two runs with one seed index (same data order): across variants at a rung, and across rungs.
    pair_correlation: float = 0.5
    rungs: tuple[float, ...] = (8e11, 1.6e12, 3.2e12, 6.4e12, 1.28e13)

    @classmethod
    def from_ladder(cls, ladder: Ladder) -> TrueLaw:
        """The law and seed noise of a real ladder: its baseline's fitted law at its baseline's compute, the
        pooled standard deviation over seeds of every run, and the correlation of two runs with one seed index
        (the within-rung deviations from the mean, paired across variants; clipped to [0, 0.9], and 0.5 where
        it cannot be estimated). A ladder with 3 seeds estimates both roughly: the simulation says how the
        interval behaves at about this ladder's noise, not at exactly it. Failed cells take no part."""
        loss = ladder.counted_loss
        mean = _seed_means(loss, None)
        laws = fit_laws(np.log(ladder.compute), mean)
        deviation = loss - mean[..., None]
        n = np.isfinite(loss).sum(-1)
        pooled = np.nansum(deviation ** 2) / max(int((n - 1).clip(min=0).sum()), 1)
        rho = 0.5
        if ladder.loss.shape[0] > 1:
            base, other = np.broadcast_arrays(deviation[:1], deviation[1:])
            ok = np.isfinite(base) & np.isfinite(other)
            if ok.sum() > 3 and np.std(base[ok]) > 0 and np.std(other[ok]) > 0:
                rho = float(np.clip(np.corrcoef(base[ok], other[ok])[0, 1], 0.0, 0.9))
        return cls(E=float(laws.E), A=float(laws.A[0]), alpha=float(laws.alpha[0]), noise_sd=float(np.sqrt(pooled)),
                   pair_correlation=rho, rungs=tuple(float(c) for c in ladder.compute[0]))


def simulate(law: TrueLaw, multiplier: float, seeds: int, ladders: int, rng: np.random.Generator) -> np.ndarray:
    """Losses (ladders, 2, R, seeds) of a baseline and a variant worth ``multiplier`` times its compute."""
    C = np.asarray(law.rungs)
    mean = np.stack([law.E + law.A * C ** -law.alpha, law.E + law.A * (multiplier * C) ** -law.alpha])
    R = len(C)
    shared = rng.standard_normal((ladders, 1, 1, seeds))  # the seed index's own effect, in every run with it
    rung = rng.standard_normal((ladders, 1, R, seeds))  # the seed's effect at one size, shared by variants
    own = rng.standard_normal((ladders, 2, R, seeds))
    rho = law.pair_correlation
    noise = math.sqrt(rho) * (math.sqrt(0.5) * shared + math.sqrt(0.5) * rung) + math.sqrt(1 - rho) * own
    return mean[None, :, :, None] + law.noise_sd * noise


@dataclass(frozen=True)
class Calibration:
    multiplier: float
    seeds: int
    ladders: int
    coverage: float  # fraction of intervals (at the target compute) that contain the true multiplier
    median_estimate: float
    relative_bias: float  # median estimate / truth - 1
    below_one: float  # fraction of point estimates below 1
    flagged: float  # fraction of ladders whose multiplier was called scale-dependent (none is, in truth)
    median_width: float  # median of hi / lo of the interval at the target (1.10: +-5% around the estimate)


def calibrate(multiplier: float, seeds: int = 3, ladders: int = 400, law: TrueLaw = TrueLaw(),
              resamples: int = 400, seed: int = 0, confidence: float = 0.95, chunk: int = 50) -> Calibration:
    """Simulate ``ladders`` ladders of a baseline and a variant worth ``multiplier``; measure the interval.

    The ladders are estimated ``chunk`` at a time as one array computation (the same code ``multipliers``
    runs on one ladder), which keeps a few hundred ladders x a few hundred resamples to seconds."""
    rng = np.random.default_rng(seed)
    losses = simulate(law, multiplier, seeds, ladders, rng)
    compute = np.stack([np.asarray(law.rungs)] * 2)
    target = float(compute[0, -1])
    estimates, covered, flagged, widths = [], [], [], []
    for first in range(0, ladders, chunk):
        batch = losses[first:first + chunk]
        draws = rng.integers(0, seeds, size=(len(batch), resamples, seeds))
        e = _estimate(batch, compute, target, None, draws, confidence)[0]
        lo, hi = np.exp(e.log_at - e.half_at), np.exp(e.log_at + e.half_at)
        estimates.append(np.exp(e.log_at))
        covered.append((lo <= multiplier) & (multiplier <= hi))
        flagged.append(e.depends)
        widths.append(np.exp(2 * e.half_at))
    estimates, covered, flagged, widths = map(np.concatenate, (estimates, covered, flagged, widths))
    median = float(np.median(estimates))
    return Calibration(multiplier, seeds, ladders, float(covered.mean()), median, median / multiplier - 1,
                       float(np.mean(estimates < 1)), float(flagged.mean()), float(np.median(widths)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lit.compare.scaling",
                                     description="the multiplier interval's calibration, by simulation")
    parser.add_argument("--ladders", type=int, default=1000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[3, 5])
    args = parser.parse_args(argv)
    print("| true multiplier | seeds | ladders | coverage of the 95% interval | median estimate | bias | "
          "estimates below 1 | called scale-dependent | median hi/lo |")
    print("|---|---|---|---|---|---|---|---|---|")
    for seeds in args.seeds:
        for m in (1.0, 1.25, 0.8):
            c = calibrate(m, seeds=seeds, ladders=args.ladders)
            print(f"| {m:.2f} | {seeds} | {c.ladders} | {c.coverage:.1%} | {c.median_estimate:.3f} | "
                  f"{c.relative_bias:+.1%} | {c.below_one:.1%} | {c.flagged:.1%} | {c.median_width:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
