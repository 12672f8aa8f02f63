"""The sequential design's statistics (lit/statistics/sequential.py): the boundary against published values and an
independent computation, the levels fitted for the paired t, Holm's step-down over looks, futility, the replay the
sweep and compare share; and its error rate and power by simulation (lit/compare/calibration.py), small enough for
the default run. Tolerances of the simulations are 3 Monte-Carlo standard errors, the power check the 5 points the
plan promises."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from lit.compare import calibration
from lit.statistics import sequential as S

REPS = 6_000
ALPHA = calibration.ALPHA
LOOKS = calibration.SEQUENTIAL_LOOKS


# --- the boundary ---

def test_obrien_fleming_boundaries_match_the_published_ones():
    # Four equally spaced looks, two-sided alpha 0.05 spent half on each side (ldbounds, gsDesign's sfLDOF at
    # one-sided 0.025): 4.3326, 2.9631, 2.3590, 2.0141. At alpha 0.10 (one-sided 0.05): 3.7496, 2.5399, 2.0161, 1.7202.
    fractions = (0.25, 0.5, 0.75, 1.0)
    assert S.z_boundaries(fractions, 0.05) == pytest.approx((4.3326, 2.9631, 2.3590, 2.0141), abs=2e-4)
    assert S.z_boundaries(fractions, 0.10) == pytest.approx((3.7496, 2.5399, 2.0161, 1.7202), abs=2e-4)
    assert S.obrien_fleming(1.0, 0.05) == pytest.approx(0.05) and S.pocock(1.0, 0.05) == pytest.approx(0.05)
    assert S.obrien_fleming(0.25, 0.05) < 1e-4 < S.pocock(0.25, 0.05)  # O'Brien-Fleming keeps alpha for the end


@pytest.mark.parametrize("spending", [S.OBRIEN_FLEMING, S.POCOCK])
def test_the_boundary_spends_the_function_under_brownian_motion(spending):
    # An independent computation: the chance of first crossing at each look from the multivariate normal of the
    # looks' z (correlation sqrt(t_j / t_k)), by scipy's integration, at uneven looks.
    looks = (3, 5, 9, 12)
    fractions = tuple(n / looks[-1] for n in looks)
    bounds = S.z_boundaries(fractions, ALPHA, spending)
    cov = np.sqrt(np.minimum.outer(fractions, fractions) / np.maximum.outer(fractions, fractions))
    stay = [1.0]
    for k in range(1, len(looks) + 1):
        limits = np.array(bounds[:k])
        stay.append(stats.multivariate_normal(np.zeros(k), cov[:k, :k]).cdf(limits, lower_limit=-limits))
    spent = 1 - np.array(stay[1:])
    expected = [S.SPENDING[spending](t, ALPHA) for t in fractions]
    assert spent == pytest.approx(expected, abs=3e-5)


def test_the_levels_fitted_for_the_paired_t_spend_no_more_than_the_increments():
    # On null paths the fit never saw: the z's levels applied to the t's p err high (the reason for the fit);
    # the fitted ones spend each look's increment, to Monte-Carlo error.
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2 ** 17, LOOKS[-1]))
    p = np.stack([S.paired_t_p(x[:, :n]) for n in LOOKS])

    def exits(levels):
        alive, out = np.ones(p.shape[1], dtype=bool), []
        for k in range(len(LOOKS)):
            crossed = alive & (p[k] < levels[k])
            out.append(crossed.mean())
            alive &= ~crossed
        return np.array(out)

    fitted = exits(S.t_levels(LOOKS, ALPHA))
    increments = np.diff([0.0] + [S.obrien_fleming(n / LOOKS[-1], ALPHA) for n in LOOKS])
    se = np.sqrt(increments / p.shape[1])
    assert np.all(np.abs(fitted - increments) <= 3 * se + 1e-5), (fitted, increments)
    assert exits(S.nominal_levels(LOOKS, ALPHA)).sum() > ALPHA + 3 * math.sqrt(ALPHA / p.shape[1])
    assert S.t_levels(LOOKS, ALPHA)[-1] < S.nominal_levels(LOOKS, ALPHA)[-1]  # the last look pays for it


# --- decisions over looks ---

def found(p, looks=LOOKS, mean=None, sd=None) -> S.Evidence:
    """Evidence of one family from p-values by (comparison, look); mean 0 and sd 1 unless given."""
    p = np.asarray(p, dtype=float)[None]
    mean = np.zeros_like(p) if mean is None else np.asarray(mean, dtype=float)[None]
    sd = np.ones_like(p) if sd is None else np.asarray(sd, dtype=float)[None]
    pairs = np.broadcast_to(np.asarray(looks[:p.shape[-1]], dtype=float), p.shape).copy()
    return S.Evidence(p, np.sign(mean) + (mean == 0), mean, sd, pairs, np.ones_like(p, dtype=bool))


def test_a_decided_comparison_frees_its_share_for_the_others_at_the_same_look():
    plan = S.Plan(LOOKS)
    half, whole = plan.levels(ALPHA / 2)[1], plan.levels(ALPHA)[1]
    between = (half + whole) / 2  # crosses alpha's boundary at look 2, not alpha / 2's
    both = S.decide(found([[0.5, 1e-9, 0.5, 0.5], [0.5, between, 0.9, 0.9]]), plan)
    assert both.state[0].tolist() == [S.REJECTED, S.REJECTED] and both.look[0].tolist() == [2, 2]
    assert both.share[0].tolist() == pytest.approx([ALPHA / 2, ALPHA])
    alone = S.decide(found([[0.5, 0.5, 0.5, 0.5], [0.5, between, 0.9, 0.9]]), plan)  # alpha / 2 holds throughout
    assert alone.state[0].tolist() == [S.RETAINED, S.RETAINED] and alone.look[0].tolist() == [4, 4]


def test_a_crossing_at_an_earlier_look_counts_once_the_share_grows():
    plan = S.Plan(LOOKS)
    first_whole, first_half = plan.levels(ALPHA)[1], plan.levels(ALPHA / 2)[1]
    early = (first_half + first_whole) / 2  # at look 2: past alpha's boundary, short of alpha / 2's
    d = S.decide(found([[0.5, 0.5, 1e-12, 0.5], [0.9, early, 0.9, 0.9]]), plan)
    # Look 2 decides the first comparison; its share passes to the second, whose look-1 statistic crossed it.
    assert d.state[0].tolist() == [S.REJECTED, S.REJECTED]
    assert d.look[0].tolist() == [3, 3] and d.crossing[0].tolist() == [3, 2]


def test_futility_stops_what_the_maximum_seeds_cannot_find_and_never_rejects_it_later():
    plan = S.Plan(LOOKS, effect_of_interest=0.1)
    # Mean 0, sd 1: even 12 seeds would find 0.1 with a few percent power, so look 2 stops it (look 1, on 3 seeds,
    # has a 2-df sd: futility is not checked there).
    d = S.decide(found([[0.5, 0.5, 1e-12, 1e-12]]), plan)
    assert d.state[0].tolist() == [S.FUTILE] and d.look[0].tolist() == [2]
    assert d.states[0, 0].tolist() == [S.OPEN] + [S.FUTILE] * 3  # the later tiny p were never read
    loud = S.Plan(LOOKS, effect_of_interest=5.0)  # 5 sd: the maximum seeds would find it, keep going
    assert S.decide(found([[0.5, 0.5, 0.5, 0.5]]), loud).state[0].tolist() == [S.RETAINED]
    quiet = S.Plan(LOOKS)  # no effect of interest: no futility rule
    assert S.decide(found([[0.5, 0.5, 0.5, 0.5]]), quiet).look[0].tolist() == [4]


def test_conditional_power_is_the_chance_the_last_look_rejects_if_the_effect_were_true():
    # The B-value formula against a direct simulation of the remaining seeds (normal, sd as observed).
    rng = np.random.default_rng(3)
    mean, sd, pairs, most, effect, critical = 0.2, 1.0, 4, 12, 0.6, 2.5
    future = rng.normal(effect, sd, (400_000, most - pairs)).sum(axis=1)
    final = (mean * pairs + future) / most / (sd / math.sqrt(most))
    simulated = (np.abs(final) >= critical).mean()
    formula = S.conditional_power(np.array(mean), np.array(sd), np.array(float(pairs)), most, effect, critical)
    assert float(formula) == pytest.approx(simulated, abs=0.003)
    mirrored = S.conditional_power(np.array(-mean), np.array(sd), np.array(float(pairs)), most, effect, critical)
    assert float(mirrored) == pytest.approx(float(formula))  # either sign of the effect of interest


def test_replay_of_per_seed_outcomes_matches_the_vectorised_rule():
    rng = np.random.default_rng(11)
    plan = S.Plan(LOOKS, effect_of_interest=0.3)
    seeds = [str(100 + i) for i in range(12)]
    differences = rng.normal([[0.0], [0.4], [1.5]], 1.0, (3, 12))
    differences[1, 4] = math.inf  # a diverged variant run: the sign-flip test from look 2 on
    outcomes = {f"v{i}": dict(zip(seeds, map(float, row), strict=True)) for i, row in enumerate(differences)}
    replayed = S.replay(outcomes, seeds, plan, plan.count)
    vectorised = S.decide(S.evidence(differences[None], plan.looks), plan)
    assert [c.state for c in replayed.comparisons] == [S.STATE_NAMES[s] for s in vectorised.state[0]]
    assert [c.look for c in replayed.comparisons] == vectorised.look[0].tolist()
    assert replayed.comparisons[1].test in (S.T_TEST, S.SIGN_FLIP)
    # A stopped comparison's later seeds change nothing (the sweep never runs them; compare may see stray ones).
    stopped = next(c for c in replayed.comparisons if c.look and c.look < plan.count)
    later = {**outcomes, stopped.label: {s: (v if seeds.index(s) < plan.looks[stopped.look - 1] else 99.0)
                                         for s, v in outcomes[stopped.label].items()}}
    assert S.replay(later, seeds, plan, plan.count).comparisons == replayed.comparisons


def test_a_look_record_says_what_was_decided_and_what_runs_next():
    seeds = [str(i) for i in range(12)]
    outcomes = {"big": {s: 1.0 + 0.1 * i for i, s in enumerate(seeds)},
                "none": {s: (-1) ** i * 0.5 for i, s in enumerate(seeds)}}
    record = S.replay(outcomes, seeds, S.Plan(LOOKS), 1).look_record(1)
    assert record["look"] == 1 and record["of"] == 4 and record["seeds"] == 3 and record["family_size"] == 2
    assert record["open"] == ["big", "none"] and record["next_seeds"] == 6
    assert record["first_step"]["share"] == pytest.approx(ALPHA / 2)
    record = S.replay(outcomes, seeds, S.Plan(LOOKS), 2).look_record(2)
    (big,) = [c for c in record["comparisons"] if c["label"] == "big"]
    assert big["state"] == "rejected" and big["look"] == 2 and big["boundary_p"] > big["p_values"][-1]
    assert record["open"] == ["none"] and record["next_seeds"] == 9


# --- error rate and power by simulation ---

@pytest.mark.parametrize("rho", calibration.SEQUENTIAL_CORRELATIONS)
def test_the_looks_keep_the_family_wise_error_at_most_alpha(rho):
    rate, seeds = calibration.sequential_null_error(np.random.default_rng(calibration.SEED), REPS, 4,
                                                    S.Plan(LOOKS, ALPHA), rho)
    assert rate.rate <= ALPHA + 3 * rate.standard_error, (rho, rate)
    assert rate.rate > 0.5 * ALPHA  # not wildly conservative: a boundary spending too little would show here
    assert seeds > LOOKS[-2]  # under the null almost every comparison runs to the last look (no futility rule)


def test_a_diverged_run_keeps_the_error_at_most_alpha():
    rate, _ = calibration.sequential_null_error(np.random.default_rng(calibration.SEED), REPS, 4,
                                                S.Plan(LOOKS, ALPHA), 0.5, diverged=True)
    assert rate.rate <= ALPHA + 3 * rate.standard_error, rate


def test_the_planned_effect_is_found_as_planned_with_fewer_seeds():
    effect, promised, rate, futile, seeds = calibration.sequential_power(np.random.default_rng(calibration.SEED),
                                                                         REPS, 4, S.Plan(LOOKS, ALPHA), 0.5)
    assert abs(rate.rate - promised) <= 0.05, (effect, promised, rate, futile)
    assert seeds < LOOKS[-1]  # it stops early where it can
    futile_rate, null_seeds = calibration.sequential_null_error(
        np.random.default_rng(calibration.SEED), REPS, 4, S.Plan(LOOKS, ALPHA, effect_of_interest=effect), 0.5)
    assert futile_rate.rate <= ALPHA + 3 * futile_rate.standard_error
    assert null_seeds < 0.8 * LOOKS[-1]  # and the futility rule spares seeds where there is nothing to find


# docs/sequential.md (Futility, and the calibration's "same draws" rows): futility's E below the MDE costs power at
# the MDE. Power without futility, and with E = MDE/2 and MDE/4 (m = 4, rho 0.5; 20,000 families, seed SEED).
POWER_AT_THE_MDE = {None: 0.788, 0.5: 0.760, 0.25: 0.756}


def test_futility_below_the_mde_costs_the_documented_power():
    # statistics-review-4 F3, on draws the documented figures never saw (seed + 1): each row within 3 Monte-Carlo
    # sds of its figure, and the cost (paired: the same draws with and without the rule) within 3 sds of the
    # documented difference, whose own Monte-Carlo sd is as large (hence the sqrt(2)).
    reps = 20_000  # 1.3 s a row
    rows = {f: calibration.futility_below_the_mde(np.random.default_rng(calibration.SEED + 1), reps, f)
            for f in POWER_AT_THE_MDE}
    for fraction, documented in POWER_AT_THE_MDE.items():
        rate = rows[fraction][0]
        assert abs(rate.rate - documented) <= 3 * rate.standard_error, (fraction, rate, documented)
    for fraction in (0.5, 0.25):
        cost = rows[None][0].rate - rows[fraction][0].rate
        documented = POWER_AT_THE_MDE[None] - POWER_AT_THE_MDE[fraction]
        sd = math.sqrt(max(cost, 1e-3) / reps)  # paired: the rule only removes finds, so cost is the share lost
        assert abs(cost - documented) <= 3 * math.sqrt(2) * sd + 5e-4, (fraction, cost, documented)
        assert rows[fraction][1] > 0.1 and rows[fraction][2] > 0.4  # futile stops, most with the estimate above E
    assert rows[0.25][2] > rows[0.5][2]  # the smaller E, the more of its stops judge the estimate, not E


def test_the_repeated_interval_excludes_0_exactly_when_the_look_decided():
    # Random families through the replay compare runs: every t-tested comparison's repeated CI at the boundary it
    # was tested against excludes 0 if and only if it was rejected (statistics-review-3, D5).
    rng = np.random.default_rng(5)
    plan = S.Plan((3, 6, 9, 12), 0.05, effect_of_interest=0.02)
    seeds = [str(s) for s in range(12)]
    seen = {True: 0, False: 0}
    short = 0
    for family in range(90):
        effects = rng.choice([0.0, 0.01, 0.03, 0.06], size=4)
        outcomes = {f"v{i}": {s: float(e + rng.normal(0, 0.03)) for s in seeds} for i, e in enumerate(effects)}
        if family % 3 == 0:
            # A third of the families miss one seed (index >= 2) of one comparison: its looks test fewer pairs than
            # the plan's n, and the |t| its boundary needs is that of the pairs tested (statistics-review-4, F1).
            del outcomes[f"v{rng.integers(4)}"][seeds[rng.integers(2, 12)]]
        result = S.replay(outcomes, seeds, plan, 4)
        for c in result.comparisons:
            low, high = c.repeated_interval
            decided = c.state == "rejected"
            assert (low > 0 or high < 0) == decided, c
            assert low <= c.mean <= high
            planned = plan.looks[c.boundary_look - 1]
            short += sum(s in outcomes[c.label] for s in seeds[:planned]) < planned
            seen[decided] += 1
    assert min(seen.values()) > 20, seen  # both kinds were met
    assert short > 10, short  # and the missing seed was met at the boundary that decided


def test_a_comparison_missing_a_seed_is_given_the_t_of_the_pairs_it_tested():
    # statistics-review-4 F1: one seed of 12 missing, the last look tests 11 pairs (10 df). Its |t| lies between
    # what 11 and 12 pairs need: not rejected, so its repeated interval must hold 0; the plan's 12 would exclude it.
    plan = S.Plan((3, 6, 9, 12), 0.05)
    seeds = [str(s) for s in range(12)]
    rng = np.random.default_rng(4)
    kept = [s for s in seeds if s != "5"]
    noise = rng.normal(0, 1, 11)
    level = plan.levels(plan.alpha)[-1]
    needed_11, needed_12 = S.critical_t(level, 11), S.critical_t(level, 12)
    assert needed_11 > needed_12
    target = (needed_11 + needed_12) / 2
    shift = target * noise.std(ddof=1) / math.sqrt(11) - noise.mean()  # |t| at the last look lands on target
    result = S.replay({"v": dict(zip(kept, map(float, noise + shift), strict=True))}, seeds, plan, 4)
    (c,) = result.comparisons
    assert c.pairs == 11 and c.boundary_look == 4 and c.state == "retained", c
    assert c.p_values[-1] > c.boundary_p  # the test at 10 df did not cross
    assert c.critical_t == pytest.approx(needed_11)
    low, high = c.repeated_interval
    assert low < 0 < high, (low, high)


def test_futility_spares_an_effect_three_times_the_effect_of_interest_on_a_noisy_comparison():
    # statistics-review-3 D2: a family of 7 (six quiet nulls, sd 0.0155), one comparison as noisy as TokenFormer's
    # (sd 0.0513) with a true effect of 3E (E = 0.03, below its 12-seed MDE of 0.063). Conditional power at E alone,
    # on a 2-df sd, stopped it 21% of the time and found it 79% of the time; without futility 99%.
    rng = np.random.default_rng(11)
    reps = 2000
    d = rng.normal(0, 1, (reps, 7, 12)) * np.array([0.0513] + [0.0155] * 6)[None, :, None]
    d[:, 0, :] += 0.089
    plan = S.Plan((3, 6, 9, 12), 0.05, effect_of_interest=0.03)
    decisions = S.decide(S.evidence(d, plan.looks), plan)
    found = float((decisions.state[:, 0] == S.REJECTED).mean())
    assert found > 0.95, found  # 0.975 measured (Monte-Carlo sd 0.004)
    assert not (decisions.states[:, :, 0] == S.FUTILE).any()  # no futility on a 3-seed look
    assert (decisions.state[:, 1:] == S.FUTILE).mean() > 0.5  # the quiet nulls still stop early



# statistics-review-3 D6: the t-levels at uneven looks (spending by look index k/K instead of information n_k/n_K
# survived the tests and gives a single comparison 0.069 at looks 9, 10, 11, 12).
@pytest.mark.parametrize("looks", [(3, 5, 12), (9, 10, 11, 12)])
def test_the_t_levels_spend_by_information_at_uneven_looks(looks):
    rng = np.random.default_rng(8)
    x = rng.standard_normal((2 ** 17, looks[-1]))
    p = np.stack([S.paired_t_p(x[:, :n]) for n in looks])
    alive, exits = np.ones(p.shape[1], dtype=bool), []
    for k, level in enumerate(S.t_levels(looks, ALPHA)):
        crossed = alive & (p[k] < level)
        exits.append(crossed.mean())
        alive &= ~crossed
    increments = np.diff([0.0] + [S.obrien_fleming(n / looks[-1], ALPHA) for n in looks])
    se = np.sqrt(increments / p.shape[1])
    # 4 Monte-Carlo sds: eight looks are checked here (seed 8 draws a 3.3-sd first look at 9, 10, 11, 12; seeds
    # 9-11 give 0.8, 0.4 and 0.1 sd); spending by look index misses the first look there by 50 sds.
    assert np.all(np.abs(np.array(exits) - increments) <= 4 * se + 1e-5), (exits, increments)
    assert sum(exits) <= ALPHA + 4 * math.sqrt(ALPHA / p.shape[1])


def test_a_look_is_written_once(tmp_path, empty_store):
    import shutil

    from mlflow import MlflowClient

    from lit.sweep.history import read_looks, write_look

    shutil.copyfile(empty_store, tmp_path / "mlflow.db")
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run_id = client.create_run(client.create_experiment("h", artifact_location=str(tmp_path / "a"))).info.run_id
    assert write_look(client, run_id, {"look": 1, "open": ["x"]})
    assert not write_look(client, run_id, {"look": 1, "open": []})  # a second record of look 1 is refused
    assert [r["open"] for r in read_looks(client, run_id)] == [["x"]]


# --- the futility rule in words (statistics-review-4, F2): every place says what decide() runs ---

def test_a_futile_comparison_beyond_e_is_described_at_its_estimate_not_at_e():
    from lit.sweep.looks import describe_look

    plan = S.Plan((3, 6, 9, 12), 0.05, effect_of_interest=0.01)
    seeds = [str(s) for s in range(12)]
    x = np.random.default_rng(0).normal(0, 1, 12)
    x += 0.028 - x[:6].mean()  # the estimate at look 2 is 0.028, above E, and the spread hides it
    result = S.replay({"v": dict(zip(seeds, map(float, x), strict=True))}, seeds, plan, 2)
    (c,) = result.comparisons
    assert c.state == "futile" and c.look == 2 and c.mean == pytest.approx(0.028)
    line = describe_look(result.look_record(2), plan.effect_of_interest, plan.futility_power)
    assert "at ±0.01" not in line and "at ±0.028 = max(E 0.01, |estimate| 0.028)" in line, line


def test_futility_is_said_not_to_act_where_no_look_before_the_last_has_4_pairs():
    from lit.compare.sequential_report import header_notes, render

    plan = S.Plan((2, 4), effect_of_interest=0.05)
    assert plan.futility_looks == ()
    seeds = [str(s) for s in range(4)]
    result = S.replay({"v": {s: float(v) for s, v in zip(seeds, (0.1, -0.2, 0.3, 0.05), strict=True)}}, seeds, plan, 2)
    section = render(result, [])
    bullet = header_notes({"sequential": plan.to_json()}, [{}, {}], [])[0]
    for text in (section, bullet, plan.to_json()["futility"]):
        assert "cannot act with these looks" in text and "±0.05" not in text, text
    assert S.Plan((3, 6, 9, 12), effect_of_interest=0.05).futility_looks == (2, 3)  # 6 and 9 pairs; never the last


def test_the_recorded_futility_rule_names_the_estimate_the_pairs_and_the_last_look():
    words = S.Plan((3, 6, 9, 12), effect_of_interest=0.05).to_json()["futility"]
    assert "max(0.05, |its current estimate|)" in words and "at least 4 paired seeds" in words, words
    assert "never at the last look" in words and "looks 2, 3" in words
    assert S.Plan((3, 6, 9, 12)).to_json()["futility"] == "none"
