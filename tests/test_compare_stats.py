"""compare's statistics on their own: each rule against an independent computation (scipy, a textbook formula, an
enumeration by hand), on inputs chosen so that the plausible wrong implementation gives a different answer."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from lit.compare import stats


def textbook_holm(p):
    """Holm as the textbook states it: step j (0-based) multiplies the j-th smallest p by m - j, the running
    maximum keeps it monotone, and no adjusted p exceeds 1."""
    p = np.where(np.isnan(p), 1.0, p)
    m = len(p)
    adjusted = np.empty(m)
    for j, i in enumerate(np.argsort(p, kind="stable")):
        adjusted[i] = min(1.0, max((m - k) * p[np.argsort(p, kind="stable")[k]] for k in range(j + 1)))
    return adjusted


# --- pairing ------------------------------------------------------------------------------------------------------


def test_pairs_by_seed_not_by_position():
    """The variant lacks seed 1 and the baseline lacks seed 4: pairing by position would pair variant seed 2
    with baseline seed 1 (and so on) and get differences of +1, +2, ... instead of exactly +1 each."""
    baseline = {"0": 0.0, "1": 10.0, "2": 20.0, "3": 30.0}
    variant = {"0": 1.0, "2": 21.5, "3": 30.5, "4": 99.0}
    paired = stats.paired_difference(variant, baseline, 0.95)
    assert paired.seeds == ("0", "2", "3")
    assert paired.differences == pytest.approx((1.0, 1.5, 0.5))
    assert paired.p_value == pytest.approx(scipy_stats.ttest_rel([1.0, 21.5, 30.5], [0.0, 20.0, 30.0]).pvalue)


def test_seeds_sort_as_numbers():
    paired = stats.paired_difference({"10": 1.0, "9": 2.0, "2": 3.0}, {"10": 0.0, "9": 0.0, "2": 0.0}, 0.95)
    assert paired.seeds == ("2", "9", "10")


# --- equal differences and NaN -------------------------------------------------------------------------------------


def test_equal_nonzero_differences_have_no_t_p_value_and_an_exact_sign_flip_p():
    """Two seeds each better by one image out of 360: t is x/0, undefined. It must not come out as p = 0."""
    paired = stats.paired_difference({"0": 0.9 + 1 / 360, "1": 0.8 + 1 / 360}, {"0": 0.9, "1": 0.8}, 0.95)
    assert paired.p_value is None and paired.zero_spread
    assert stats.sign_flip_p(paired.differences) == pytest.approx(0.5)  # 2 of the 4 sign patterns are as extreme
    assert stats.sign_flip_p([0.01] * 6) == pytest.approx(2 / 64)
    assert math.isnan(stats.paired_t_p(np.array([[0.0, 0.0, 0.0]]))[0])


def test_nan_counts_as_one_wherever_it_sits():
    a = stats.holm([math.nan, 0.001, 0.002])
    b = stats.holm([0.001, 0.002, math.nan])
    assert a == pytest.approx([1.0, 0.003, 0.004]) and b == pytest.approx([0.003, 0.004, 1.0])
    assert stats.benjamini_hochberg([math.nan, 0.01, 0.02]) == pytest.approx(
        [1.0, *stats.benjamini_hochberg([0.01, 0.02, 1.0])[:2]])


# --- Holm, BH and the intervals in step with Holm -------------------------------------------------------------------


def test_holm_is_capped_at_one():
    assert stats.holm([0.6, 0.9]) == pytest.approx([1.0, 1.0])
    assert stats.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])


def test_holm_matches_the_textbook_on_random_vectors_with_ties():
    rng = np.random.default_rng(3)
    for _ in range(300):
        p = np.round(rng.uniform(0, 0.6, rng.integers(1, 9)), 2)  # rounding makes ties
        np.testing.assert_allclose(stats.holm(list(p)), textbook_holm(p))


def test_benjamini_hochberg_matches_scipy():
    rng = np.random.default_rng(4)
    for _ in range(100):
        p = rng.uniform(0, 0.3, rng.integers(1, 12))
        np.testing.assert_allclose(stats.benjamini_hochberg(list(p)), scipy_stats.false_discovery_control(p))


def test_holm_intervals_exclude_zero_exactly_when_holm_rejects():
    """Random families of paired differences, some with effects: each t interval drawn at its Holm level excludes 0
    if and only if Holm's adjusted p is below alpha."""
    rng = np.random.default_rng(5)
    alpha, checked, rejected = 0.05, 0, 0
    for _ in range(400):
        m, n = rng.integers(1, 8), rng.integers(2, 9)
        differences = rng.standard_normal((m, n)) + rng.choice([0.0, 0.5, 1.5, 4.0], size=(m, 1))
        p = stats.paired_t_p(differences)
        adjusted, levels = stats.holm(list(p)), stats.holm_levels(list(p), alpha)
        for row, p_adjusted, level in zip(differences, adjusted, levels, strict=True):
            mean, se = row.mean(), row.std(ddof=1) / math.sqrt(n)
            low, high = stats.t_interval(mean, se, n - 1, 1 - level)
            assert (low > 0 or high < 0) == (p_adjusted < alpha)
            checked += 1
            rejected += p_adjusted < alpha
    assert 0.2 * checked < rejected < 0.8 * checked  # both sides of the property were exercised


# --- sign-flip, TOST, power ----------------------------------------------------------------------------------------


def test_sign_flip_matches_an_enumeration_by_hand_and_wilcoxon():
    d = [0.3, -0.1, 0.7, 0.2, 0.5]
    ranks = scipy_stats.rankdata(np.abs(d))
    observed = abs(np.sum(np.sign(d) * ranks))
    patterns = list(itertools.product([-1, 1], repeat=len(d)))
    expected = np.mean([abs(np.dot(signs, ranks)) >= observed for signs in patterns])
    assert stats.sign_flip_p(d) == pytest.approx(expected)
    assert stats.sign_flip_p(d) == pytest.approx(scipy_stats.wilcoxon(d, method="exact").pvalue)


def test_a_diverged_seed_is_the_largest_rank_against_the_variant():
    finite = stats.sign_flip_p([-0.1, -0.2, -0.3, -0.4, -0.5, -0.6])
    with_divergence = stats.sign_flip_p([-0.1, -0.2, -0.3, -0.4, -0.5, math.inf])
    assert finite == pytest.approx(2 / 64) and with_divergence > 0.2
    assert stats.signed_rank_sum([-0.1, -0.2, math.inf]) == pytest.approx(0.0)


def test_tost_is_the_larger_one_sided_p():
    d = np.array([0.02, -0.01, 0.03, 0.0, 0.01])
    margin = 0.05
    lower = scipy_stats.ttest_1samp(d, -margin, alternative="greater").pvalue
    upper = scipy_stats.ttest_1samp(d, margin, alternative="less").pvalue
    assert stats.tost_p(d[None, :], margin)[0] == pytest.approx(max(lower, upper))


def test_minimum_detectable_effect_has_the_stated_power():
    sd, n, alpha = 0.02, 4, 0.05 / 6
    effect = stats.minimum_detectable_effect(sd, n, alpha)
    critical = scipy_stats.t.ppf(1 - alpha / 2, n - 1)
    shift = effect * math.sqrt(n) / sd
    power = scipy_stats.nct.sf(critical, n - 1, shift)  # the lower tail is below 1e-9 here (scipy: NaN)
    assert power == pytest.approx(0.8, abs=1e-6)
    simulated = np.random.default_rng(6).standard_normal((40_000, n)) * sd + effect
    assert np.mean(stats.paired_t_p(simulated) < alpha) == pytest.approx(0.8, abs=0.01)
    # 3 seeds and Holm over 12: about 4.6 times the unadjusted 95% half-width (the old "noise floor")
    half_width = scipy_stats.t.ppf(0.975, 2) * 1.0 / math.sqrt(3)
    assert stats.minimum_detectable_effect(1.0, 3, 0.05 / 12) / half_width == pytest.approx(4.57, abs=0.02)


def test_seeds_needed_is_the_fewest_with_the_power():
    for effect, sd, alpha in ((0.5, 1.0, 0.05), (0.02, 0.015, 0.0125), (1.0, 0.2, 0.01)):
        n = stats.seeds_needed(effect, sd, alpha)
        assert stats.power(effect, sd, n, alpha) >= 0.8
        assert n == 2 or stats.power(effect, sd, n - 1, alpha) < 0.8


def test_seeds_needed_matrix_is_seeds_needed_of_each_sd():
    """The vectorised plan the calibration runs gives what the scalar walk gives, across small and large answers,
    a zero spread (None) and answers beyond ``most`` (None)."""
    sds = np.concatenate([np.geomspace(0.001, 5.0, 40), [0.0]])
    for effect, alpha in ((0.03, 0.05 / 24), (1.0, 0.05 / 4), (-0.5, 0.05)):
        scalar = [stats.seeds_needed(effect, sd, alpha, most=3000) for sd in sds]
        expected = np.array([np.nan if n is None else n for n in scalar], dtype=float)
        np.testing.assert_array_equal(stats.seeds_needed_matrix(effect, sds, alpha, most=3000), expected)


def test_the_sd_upper_limit_covers_the_true_sd_four_times_in_five():
    """The chi-square limit by hand, and its coverage on normal samples: above the true std in 80% of them (a
    limit from the wrong tail of chi2 would cover in 20%)."""
    d = np.array([[0.3, -0.1, 0.7], [1.0, 2.0, 4.0]])
    by_hand = d.std(axis=1, ddof=1) * math.sqrt(2 / scipy_stats.chi2.ppf(0.2, 2))
    np.testing.assert_allclose(stats.sd_upper_limit(d), by_hand)
    assert stats.sd_limit_factor(3) == pytest.approx(2.117, abs=1e-3)
    for n in (3, 6, 10):
        samples = np.random.default_rng(n).standard_normal((40_000, n)) * 0.02
        assert np.mean(stats.sd_upper_limit(samples) >= 0.02) == pytest.approx(0.8, abs=0.01)


def test_the_printed_mde_and_plan_read_the_sd_upper_limit():
    d = np.array([[0.01, -0.02, 0.015, 0.0], [0.0, 0.0, 0.0, 0.0]])
    upper = stats.sd_upper_limit(d[:1])[0]
    mde = stats.detectable_effect(d, 0.05 / 6)
    assert mde[0] == pytest.approx(stats.minimum_detectable_effect(upper, 4, 0.05 / 6), rel=1e-9)
    assert math.isnan(mde[1])  # no spread: no MDE
    plan = stats.planned_seeds(0.02, d, 0.05 / 6)
    assert plan[0] == stats.seeds_needed(0.02, upper, 0.05 / 6) and math.isnan(plan[1])
    assert math.isnan(stats.detectable_effect(d[:, :1], 0.05)[0])  # one pair: no spread to speak of


def test_seed_correlation_is_pearsons_over_the_paired_seeds():
    rng = np.random.default_rng(7)
    baseline = {str(s): float(x) for s, x in enumerate(rng.standard_normal(6))}
    variant = {str(s): 0.6 * baseline[str(s)] + float(x) for s, x in enumerate(rng.standard_normal(6))}
    del variant["2"]  # a seed the variant lacks: pairing by seed, not by position
    seeds = stats.paired_difference(variant, baseline, 0.95).seeds
    expected = np.corrcoef([variant[s] for s in seeds], [baseline[s] for s in seeds])[0, 1]
    assert stats.seed_correlation(variant, baseline, seeds) == pytest.approx(expected)
    differences = [variant[s] - baseline[s] for s in seeds]  # not the differences' correlation with anything
    assert abs(expected - np.corrcoef(differences, [baseline[s] for s in seeds])[0, 1]) > 0.1
    assert stats.seed_correlation(variant, baseline, seeds[:2]) is None  # two points always correlate +-1
    assert stats.seed_correlation({"0": 1.0, "1": 1.0, "2": 1.0}, baseline, ("0", "1", "2")) is None


def test_bounded_interval_stays_inside_zero_one():
    values = [0.95, 0.96, 0.10]  # one collapsed seed: the raw t interval crosses 100%
    raw = stats.summarize(values, 0.95).interval
    bounded = stats.summarize_bounded(values, 0.95)
    assert raw[1] > 1 and 0 < bounded.interval[0] < bounded.interval[1] < 1
    assert bounded.mean == pytest.approx(np.mean(values))


# --- curves --------------------------------------------------------------------------------------------------------


def history(rows):
    return pd.DataFrame(rows, columns=["run_id", "step", "timestamp", "value"])


def test_mean_curve_keeps_only_the_steps_every_run_logged():
    points = history([("a", 0, 0, 5.0), ("a", 100, 1, 4.0), ("a", 200, 2, 3.0),
                      ("b", 0, 0, 6.0), ("b", 200, 2, 4.0)])  # run b never logged step 100
    curve = stats.mean_curve(points)
    assert list(curve["step"]) == [0.0, 200.0]
    assert list(curve["mean"]) == pytest.approx([5.5, 3.5])


def test_a_step_logged_twice_keeps_its_latest_value():
    """A resumed run logs its resume step again: the later value is the run's."""
    points = history([("a", 0, 0, 5.0), ("a", 100, 1, 4.0), ("a", 100, 9, 3.5),
                      ("b", 0, 0, 5.0), ("b", 100, 1, 4.5)])
    assert stats.final_value(points[points.run_id == "a"]) == 3.5
    assert list(stats.mean_curve(points)["mean"]) == pytest.approx([5.0, 4.0])
    assert list(stats.last_values(points)["value"]) == [5.0, 3.5, 5.0, 4.5]


def test_the_first_crossing_counts_on_a_non_monotone_curve():
    steps, values = [0, 100, 200, 300], [5.0, 3.0, 3.6, 3.1]
    assert stats.step_reaching(steps, values, 3.2, "min") == pytest.approx(100 * (5 - 3.2) / 2)
    assert stats.final_value(history([("a", s, s, v) for s, v in zip(steps, values, strict=True)])) == 3.1


def test_the_report_metric_takes_the_protocols_mode_only_when_it_is_the_same_quantity():
    from lit.compare.analysis import metric_direction

    loss = {"metric": "val/loss", "report_metric": "test/loss", "mode": "min"}
    assert metric_direction(loss, "test/loss")[0] == "min"
    # A sweep tuned on a loss but reporting accuracy: accuracy keeps its own direction.
    mixed = {"metric": "val/loss", "report_metric": "test/acc1", "mode": "min"}
    assert metric_direction(mixed, "test/acc1") == ("max", "the metric's name")
    custom = {"metric": "val/iou_custom", "report_metric": "test/iou_custom", "mode": "max"}
    assert metric_direction(custom, "test/iou_custom")[0] == "max"
