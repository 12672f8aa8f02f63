"""Steps to target with censoring (lit/compare/analysis.py steps_to_target, stats.censored_median): a variant
identical to the baseline must not look faster. Dropping the seeds that never reached the target (the old rule)
kept only the seeds that ended well, and its 95% interval lay above 1 in 27.5% of such sweeps (statistics
review 2, D1)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from lit.compare import stats
from lit.compare.analysis import VariantResult, steps_to_target

STEPS = np.arange(10, 310, 10)


def runs(rng: np.random.Generator, seeds: int) -> dict[str, pd.DataFrame]:
    """Loss curves still falling at the end: a persistent per-run offset (the seed) plus evaluation noise."""
    offset = rng.normal(0, 0.02, seeds)
    noise = rng.normal(0, 0.005, (seeds, len(STEPS)))
    values = 2.0 + 2.0 * np.exp(-STEPS / 100.0) + offset[:, None] + noise
    return {str(s): pd.DataFrame({"step": STEPS, "value": values[s]}) for s in range(seeds)}


def result(label: str, curves: dict[str, pd.DataFrame]) -> VariantResult:
    return VariantResult(label=label, overrides=label, values={}, summary=None, tuned=None, parameters=None,
                         throughput=None, throughput_metric=None, relative_throughput=None, items_per_step=None,
                         spike_count=None, curve=pd.DataFrame(columns=["step", "mean", "std", "n"]),
                         seed_curves=curves)


def simulate(sweeps: int, seeds: int, seed: int = 0) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    above = below = old_above = 0
    for _ in range(sweeps):
        base, variant = result("base", runs(rng, seeds)), result("same", runs(rng, seeds))
        t = steps_to_target(variant, base, "min", 0.95)
        if t.interval is not None:
            above += t.interval[0] > 1 and not t.summary.low_bounded
            below += t.interval[1] < 1
        if len(t.ratios) >= 2:  # the old rule: a t interval over the reached seeds only
            old = stats.summarize(np.log(list(t.ratios.values())), 0.95)
            old_above += old.interval is not None and old.interval[0] > 0
    return {"above": above / sweeps, "below": below / sweeps, "old_above": old_above / sweeps}


@pytest.mark.parametrize("seeds", [3, 6, 10])
def test_an_identical_variant_is_not_faster(seeds):
    rates = simulate(250, seeds)
    # A two-sided interval at >= 95% coverage: at most 2.5% each side (plus simulation error, 2 sd ~ 1.6 points).
    assert rates["above"] <= 0.05 and rates["below"] <= 0.05
    if seeds >= 6:
        assert rates["old_above"] > 0.15  # the simulation reproduces the bias it guards against


def test_a_seed_that_never_reaches_counts_as_slower():
    steps = np.arange(10, 110, 10)
    base = result("base", {str(s): pd.DataFrame({"step": steps, "value": 3.0 - 0.01 * steps}) for s in range(6)})
    # Three seeds reach the target in half the steps, three never do (they end 0.1 above it).
    curves = {str(s): pd.DataFrame({"step": steps, "value": 3.0 - 0.02 * steps if s < 3 else 2.1 - 0.0 * steps})
              for s in range(6)}
    t = steps_to_target(result("v", curves), base, "min", 0.95)
    assert t.reached == 3 and set(t.bounds) == {"3", "4", "5"}
    assert t.bounds["3"] == pytest.approx(100 / 100)  # the baseline seed reached at step 100, the variant ran to 100
    assert t.summary.median_bounded and t.interval[0] <= 1 <= t.interval[1]  # 2x on half the seeds decides nothing
    assert t.summary.low_bounded and t.summary.level == pytest.approx(1 - 2 / 2**6)
    assert t.summary.p_sign == pytest.approx(1.0)
