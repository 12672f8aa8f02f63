"""The two tests of paired differences every decision rests on, vectorised over rows: the paired t and the exact
sign-flip (signed-rank) test. Pure functions of numbers, on the floor that the sweep's looks and compare's reports
both stand on (``lit/statistics``)."""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

EXACT_SIGN_FLIP_MAX = 16  # pairs enumerated exactly (2^16 patterns); beyond, a Monte-Carlo estimate
MONTE_CARLO_FLIPS = 65_536


def paired_t_p(differences: np.ndarray) -> np.ndarray:
    """Two-sided p of the one-sample t-test of each row's mean against 0 (the paired t-test). A row whose values
    are all equal has zero spread: t is undefined (0/0 or x/0) and its p is NaN, never 0 or 1."""
    n = differences.shape[-1]
    mean = differences.mean(axis=-1)
    std = differences.std(axis=-1, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = mean / (std / math.sqrt(n))
    p = 2 * stats.t.sf(np.abs(t), n - 1)
    return np.where(std > 1e-12 * np.maximum(1.0, np.abs(mean)), p, np.nan)


def sign_flip_p_matrix(differences: np.ndarray) -> np.ndarray:
    """``sign_flip_p`` of each row (rows of equal length), vectorised over rows."""
    d = np.nan_to_num(np.asarray(differences, dtype=float), nan=0.0)
    n = d.shape[1]
    ranks = stats.rankdata(np.abs(d), axis=1)
    signed = np.sign(d) * ranks
    observed = np.abs(signed.sum(axis=1))
    if n <= EXACT_SIGN_FLIP_MAX:
        patterns = 1 - 2 * ((np.arange(2 ** n)[:, None] >> np.arange(n)) & 1)
        extra = 0
    else:
        patterns = np.random.default_rng(0).choice([-1, 1], size=(MONTE_CARLO_FLIPS, n))
        extra = 1  # the observed pattern counts once: (b + 1) / (B + 1), a valid Monte-Carlo p
    flipped = np.abs(signed @ patterns.T)
    at_least = (flipped >= observed[:, None] - 1e-9).sum(axis=1)
    return (at_least + extra) / (patterns.shape[0] + extra)
