"""compare's error rates by simulation, in-process (lit/compare/calibration.py runs the report's own functions on
matrices of simulated families): Holm's family-wise false-verdict rate under the null, the power at the MDE and at
the seeds ``--plan`` asks for (at the true sd: the formulas; and with the sd estimated from the sweep's own seeds
as the report estimates it: what the report prints), and TOST's false-equivalence rate. Tolerances are 3
Monte-Carlo standard errors (the power checks at the true sd: the ±5 points the plan promises)."""

from __future__ import annotations

import numpy as np
import pytest

from lit.compare import calibration

REPS = 6_000
ALPHA = calibration.ALPHA


@pytest.mark.parametrize("rho", calibration.CORRELATIONS)
def test_null_family_wise_error_is_at_most_alpha(rho):
    rng = np.random.default_rng(calibration.SEED)
    for comparisons, seeds in ((4, 3), (6, 6)):
        rate = calibration.null_family_error(rng, REPS, comparisons, seeds, rho)
        assert rate.rate <= ALPHA + 3 * rate.standard_error, (comparisons, seeds, rho, rate)
        assert rate.rate > 0.5 * ALPHA  # Holm is not wildly conservative here: the test would notice a broken p


@pytest.mark.parametrize(("comparisons", "seeds", "rho"), [(4, 3, 0.5), (4, 6, 0.0), (8, 8, 0.9)])
def test_the_mde_at_the_true_sd_is_found_at_eighty_percent(comparisons, seeds, rho):
    _, rate = calibration.power_at_planned_effect(np.random.default_rng(calibration.SEED), REPS, comparisons, seeds,
                                                  rho)
    assert abs(rate.rate - 0.8) <= 0.05, rate


@pytest.mark.parametrize(("comparisons", "seeds", "rho", "spread"), [
    (4, 3, 0.5, None), (4, 6, 0.0, None), (8, 10, 0.9, None),
    (4, 3, 0.0, (2.0, 1.0, 1.0, 1.0)),  # the noisiest row of a family whose variants pair unequally well
])
def test_the_printed_mde_holds_with_the_sd_estimated_as_the_report_does(comparisons, seeds, rho, spread):
    """The issue's goal is a mean power of at least 0.75 at the printed MDE at 3 seeds (the observed sd gave 0.62);
    the upper confidence limit gives about 0.88 at every n. The upper bound notices a limit far more conservative
    than asked for."""
    ratio, rate = calibration.power_at_printed_mde(np.random.default_rng(calibration.SEED), REPS, comparisons, seeds,
                                                   rho, spread)
    assert 0.8 <= rate.rate <= 0.95, (ratio, rate)
    assert ratio > 1  # the printed MDE errs large: at 3 seeds the observed sd's errs small (median 0.84)


def test_a_plan_from_a_three_seed_pilot_reaches_its_power():
    """``--plan`` from a 3-seed pilot, as the plan runs it; the observed sd's plan reached 0.60 here."""
    median, true_seeds, rate = calibration.power_of_plan_from_pilot(np.random.default_rng(calibration.SEED), REPS, 4,
                                                                     3, 1.0, 1.0)
    assert 0.8 <= rate.rate <= 0.95, (median, true_seeds, rate)
    assert median > true_seeds  # the price: more seeds than the true sd needs


def test_plan_seeds_give_the_promised_power():
    seeds, promised, rate = calibration.power_at_planned_seeds(np.random.default_rng(calibration.SEED), REPS, 4,
                                                               1.0, 1.0)
    assert promised >= 0.8 and abs(rate.rate - promised) <= 0.05, (seeds, promised, rate)


def test_tost_false_equivalence_is_at_most_alpha():
    rng = np.random.default_rng(calibration.SEED)
    for seeds, margin in ((6, 1.0), (10, 0.5), (4, 2.0)):
        false, power = calibration.tost_rates(rng, REPS, seeds, margin)
        assert false.rate <= ALPHA + 3 * false.standard_error, (seeds, margin, false)
        assert power.rate > false.rate  # equivalence at a true 0 is called more often than at the margin


def test_sign_flip_test_keeps_its_level_without_normality():
    rate = calibration.sign_flip_size(np.random.default_rng(calibration.SEED), REPS, 7)
    assert rate.rate <= ALPHA + 3 * rate.standard_error
