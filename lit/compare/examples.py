"""Test-set sampling noise: an interval for a paired difference that resamples the test examples as well as the
seeds (the runs' ``test_examples.npz``, ``lit/tracking/per_example.py``).

A sweep's runs are all scored on one test split, so the seed-only interval answers "over training randomness, on
this test set". The two-way interval adds the test set's own sampling noise: resample seeds and examples, each
with replacement and independently, and take the mean of the paired per-example differences over the resampled
grid (a percentile interval). Resampling both factors counts their interaction twice, so it errs wide (Owen 2007,
"The pigeonhole bootstrap"); it is the interval to read for "on another test set of this size". Verdicts stay on
the seed-only test, declared before the runs.
"""

from __future__ import annotations

import tempfile

import numpy as np

RESAMPLES = 4000
SEED = 20261125  # fixed: the same report twice prints the same interval


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


def two_way_interval(differences: np.ndarray, confidence: float, resamples: int = RESAMPLES,
                     seed: int = SEED) -> tuple[float, float] | None:
    """Percentile interval of the mean of ``differences`` (seeds x examples: variant - baseline per example at
    each paired seed) under resampling of seeds and examples together. None below 2 seeds or 2 examples."""
    d = np.asarray(differences, dtype=float)
    if d.ndim != 2 or d.shape[0] < 2 or d.shape[1] < 2:
        return None
    seeds, examples = d.shape
    rng = np.random.default_rng(seed)
    # A resample's mean is w_s^T D w_e / (S E) with multinomial counts w: no (S x E) copy per resample.
    w_seeds = rng.multinomial(seeds, np.full(seeds, 1 / seeds), size=resamples)
    w_examples = rng.multinomial(examples, np.full(examples, 1 / examples), size=resamples)
    means = np.einsum("bs,se,be->b", w_seeds, d, w_examples) / (seeds * examples)
    alpha = 1 - confidence
    low, high = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return float(low), float(high)
