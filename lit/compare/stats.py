"""The statistics of a comparison: t intervals, paired t-tests with Holm's adjustment, and reading curves.

A sweep has a handful of seeds (3-5), so every interval uses Student's t with n-1 degrees of freedom
(``scipy.stats.t``), never a normal approximation that would be too narrow at n=3. Runs of two variants
that share a seed share their data order and initialisation noise, so they are compared as pairs
(``scipy.stats.ttest_rel``): the seed-to-seed noise cancels, which is what makes small effects visible.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

MODES = ("min", "max")
BETTER, WORSE, UNRESOLVED = "better", "worse", "not distinguishable at this noise"


@dataclass(frozen=True)
class Summary:
    """Mean of n values, with the sample std (ddof=1) and a t interval of the mean when n >= 2."""

    n: int
    mean: float
    std: float | None
    interval: tuple[float, float] | None

    @property
    def half_width(self) -> float | None:
        return None if self.interval is None else (self.interval[1] - self.interval[0]) / 2


@dataclass(frozen=True)
class Paired:
    """Variant minus baseline over the seeds both have: the mean difference, its interval and the
    two-sided paired t-test (no interval and no p-value below 2 pairs: one pair has no noise estimate)."""

    seeds: tuple[str, ...]
    differences: tuple[float, ...]
    summary: Summary | None
    p_value: float | None


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


def t_interval(center: float, standard_error: float, dof: int, confidence: float) -> tuple[float, float]:
    """The two-sided ``confidence`` interval ``center ± t_{dof} * standard_error``."""
    if standard_error == 0:  # identical values: scipy would answer nan for a zero scale
        return center, center
    low, high = stats.t.interval(confidence, dof, loc=center, scale=standard_error)
    return float(low), float(high)


def paired_difference(variant: Mapping[str, float], baseline: Mapping[str, float], confidence: float) -> Paired:
    """Variant - baseline, pairing values by seed (the keys); seeds only one side has are left out."""
    seeds = tuple(sorted(set(variant) & set(baseline), key=seed_order))
    ours = np.array([variant[s] for s in seeds], dtype=float)
    theirs = np.array([baseline[s] for s in seeds], dtype=float)
    differences = ours - theirs
    if not seeds:
        return Paired(seeds, (), None, None)
    p_value = None
    if len(seeds) >= 2:
        if np.all(differences == 0):
            p_value = 1.0  # no difference at all: scipy's 0/0 would be nan
        else:
            with warnings.catch_warnings():  # constant nonzero differences: t is infinite, p is 0 (fine)
                warnings.simplefilter("ignore", RuntimeWarning)
                p_value = float(stats.ttest_rel(ours, theirs).pvalue)
    return Paired(seeds, tuple(float(d) for d in differences), summarize(differences, confidence), p_value)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment: controls the chance of any false "better"/"worse" over all comparisons
    of a report (a sweep of 8 variants at p < 0.05 would otherwise call one in three noise a finding), and
    is never less powerful than Bonferroni. The adjusted p-values come back in the order given."""
    m = len(p_values)
    adjusted = [0.0] * m
    running = 0.0
    for rank, index in enumerate(sorted(range(m), key=lambda i: p_values[i])):
        running = max(running, min(1.0, (m - rank) * p_values[index]))  # monotone: a smaller p never adjusts higher
        adjusted[index] = running
    return adjusted


def improvement(difference: float, mode: str) -> float:
    """A difference (variant - baseline) turned so that positive means better, whichever way the metric goes."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return -difference if mode == "min" else difference


def verdict(difference: float, p_adjusted: float, alpha: float, mode: str) -> str:
    """"better" or "worse" when the adjusted p is below ``alpha``, in the direction of ``mode``."""
    if p_adjusted >= alpha or difference == 0:
        return UNRESOLVED
    return BETTER if improvement(difference, mode) > 0 else WORSE


def reached(value: float, target: float, mode: str) -> bool:
    return value <= target if mode == "min" else value >= target


def step_reaching(steps: Sequence[float], values: Sequence[float], target: float, mode: str) -> float | None:
    """The first step at which the curve reaches ``target``, linearly interpolated between the two validation
    points around the crossing (a curve already there at its first point answers that point's step; one that
    never gets there answers None). The first crossing counts: later noise back above it does not undo it."""
    for i, (step, value) in enumerate(zip(steps, values, strict=True)):
        if reached(value, target, mode):
            if i == 0:
                return float(step)
            step_before, value_before = steps[i - 1], values[i - 1]
            return float(step_before + (target - value_before) * (step - step_before) / (value - value_before))
    return None


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
