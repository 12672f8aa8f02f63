"""Test-set sampling noise: an interval for a paired difference over seeds and test examples (the runs'
``test_examples.npz``, ``lit/tracking/per_example.py``).

A sweep's runs are all scored on one test split, so the seed-only interval answers "over training randomness, on
this test set". The two-way interval adds the test set's own sampling noise. The paired per-example differences
form a seeds x examples grid, d[s, e] = mu + a_s + b_e + (ab)_se; the mean over another S seeds and another test
set of E examples varies by sigma_a^2 / S + sigma_b^2 / E + sigma_ab^2 / (S E), which the two-way ANOVA's mean
squares estimate without bias as (MS_seeds + MS_examples - MS_interaction) / (S E). The interval is a t interval
on that standard error, with Satterthwaite's degrees of freedom (S - 1 when seeds dominate, as they do here).

An earlier percentile bootstrap over seeds and examples was called wide; it was about half the seed-only width
at 6 seeds (normal quantiles on a variance shrunk by (S - 1) / S) and covered 86.7% at a nominal 95%. This one is
checked by simulation at 6, 10 and 12 seeds at the levels reports use (``python -m lit.compare.calibration
--two_way``, the figures in docs/comparing-statistics.md; tests/test_compare_examples.py). It is never narrower
than the seed-only t interval at the same level, so at 6 seeds of the text suite it is that interval in most grids.
It assumes independent test examples: correlated ones (neighbouring windows of one text) make it too narrow.
Verdicts stay on the seed-only test, declared before the runs.
"""

from __future__ import annotations

import tempfile

import numpy as np
from scipy import stats


def load(client, run_ids: list[str], key: str) -> dict[str, np.ndarray]:
    """``key``'s per-example array of each run that logged one (the others are absent)."""
    from mlflow.exceptions import MlflowException

    from lit.tracking import per_example

    out = {}
    for run_id in run_ids:
        with tempfile.TemporaryDirectory() as tmp:
            try:
                arrays = per_example.read(client.download_artifacts(run_id, per_example.ARTIFACT, tmp))
            except (MlflowException, OSError):
                continue
        if key in arrays:
            out[run_id] = arrays[key]
    return out


def two_way_standard_error(differences: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean, standard error, degrees of freedom) of the grid mean of ``differences`` (..., seeds, examples) for
    another draw of both seeds and test examples, over any leading axes (the calibration passes thousands)."""
    d = np.asarray(differences, dtype=float)
    seeds, examples = d.shape[-2:]
    mean = d.mean(axis=(-2, -1))
    by_seed, by_example = d.mean(axis=-1), d.mean(axis=-2)
    ms_seeds = examples * ((by_seed - mean[..., None]) ** 2).sum(axis=-1) / (seeds - 1)
    ms_examples = seeds * ((by_example - mean[..., None]) ** 2).sum(axis=-1) / (examples - 1)
    residual = d - by_seed[..., :, None] - by_example[..., None, :] + mean[..., None, None]
    df_interaction = (seeds - 1) * (examples - 1)
    ms_interaction = (residual ** 2).sum(axis=(-2, -1)) / df_interaction
    # The examples' own share, floored at 0: a test set's noise cannot make the mean surer.
    example_share = np.maximum(ms_examples - ms_interaction, 0.0)
    total = ms_seeds + example_share
    # Satterthwaite: the variance is a sum of mean squares; its df lie between the seeds' S - 1 and more.
    has_share = example_share > 0
    denominator = (ms_seeds ** 2 / (seeds - 1)
                   + has_share * (ms_examples ** 2 / (examples - 1) + ms_interaction ** 2 / df_interaction))
    with np.errstate(divide="ignore", invalid="ignore"):
        df = np.where(denominator > 0, total ** 2 / denominator, seeds - 1)
    return mean, np.sqrt(total / (seeds * examples)), np.maximum(df, seeds - 1)


def two_way_intervals(differences: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) of the ``confidence`` t interval of each grid's mean (``two_way_standard_error``), never
    narrower than the seed-only t interval at the same level."""
    d = np.asarray(differences, dtype=float)
    seeds = d.shape[-2]
    mean, se, df = two_way_standard_error(d)
    seed_only = d.mean(axis=-1).std(axis=-1, ddof=1) / np.sqrt(seeds)
    tail = (1 - confidence) / 2
    half = np.maximum(stats.t.isf(tail, df) * se, stats.t.isf(tail, seeds - 1) * seed_only)
    return mean - half, mean + half


def two_way_interval(differences: np.ndarray, confidence: float) -> tuple[float, float] | None:
    """The interval over seeds and test examples of the mean of ``differences`` (seeds x examples: variant -
    baseline per example at each paired seed), at ``confidence``. None below 2 seeds or 2 examples."""
    d = np.asarray(differences, dtype=float)
    if d.ndim != 2 or d.shape[0] < 2 or d.shape[1] < 2:
        return None
    low, high = two_way_intervals(d, confidence)
    return float(low), float(high)
