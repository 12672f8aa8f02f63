"""Calibration of compare's statistics by simulation: does the report err as often as it says, and no more?

Variants that differ from the baseline only by seed noise, with paired correlation rho between a variant's run and
the baseline's run of the same seed (the shared data order makes it positive; different inits can make it
anything). Every variant shares the baseline's runs, so the family's tests are correlated, as in a real sweep. The
same functions the report runs (``stats.paired_t_p``, ``stats.holm_matrix``, ``stats.tost_p``,
``stats.sign_flip_p_matrix``, ``stats.minimum_detectable_effect``, ``stats.seeds_needed``, and the estimates of
the std the MDE and the plan read, ``stats.detectable_effect`` and ``stats.planned_seeds``) run here on a matrix
of simulated families at once.

``python -m lit.compare.calibration`` prints the figures that docs/comparing-statistics.md records.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

import numpy as np

from lit.compare import stats
from lit.statistics import sequential

SEED = 20_260_601
ALPHA = 0.05
CORRELATIONS = (-0.5, 0.0, 0.5, 0.9, 0.99)


@dataclass(frozen=True)
class Rate:
    """A simulated rate with its Monte-Carlo standard error."""

    rate: float
    reps: int

    @property
    def standard_error(self) -> float:
        return math.sqrt(max(self.rate * (1 - self.rate), 1e-12) / self.reps)


def paired_differences(rng: np.random.Generator, reps: int, comparisons: int, seeds: int, rho: float,
                       effects: np.ndarray | None = None, spread: np.ndarray | None = None) -> np.ndarray:
    """Simulated variant - baseline per seed, shape (reps, comparisons, seeds): unit-variance runs, a variant's
    run correlated ``rho`` with the baseline's run of its seed, ``effects`` (per comparison, or per family and
    comparison) added to the variants. ``spread`` (per comparison) scales each comparison's noise: a family whose
    variants pair with the baseline's seeds more or less well, as real ones do."""
    baseline = rng.standard_normal((reps, 1, seeds))
    own = rng.standard_normal((reps, comparisons, seeds))
    differences = rho * baseline + math.sqrt(1 - rho ** 2) * own - baseline
    if spread is not None:
        differences = differences * np.asarray(spread, dtype=float)[None, :, None]
    if effects is not None:
        differences = differences + np.broadcast_to(np.asarray(effects, dtype=float), (reps, comparisons))[:, :, None]
    return differences


def family_rejections(differences: np.ndarray, alpha: float) -> np.ndarray:
    """Holm's verdicts, as compare draws them: reject where the adjusted paired-t p is below alpha."""
    reps, comparisons, _ = differences.shape
    p = stats.paired_t_p(differences.reshape(reps * comparisons, -1)).reshape(reps, comparisons)
    return stats.holm_matrix(p) < alpha


def null_family_error(rng: np.random.Generator, reps: int, comparisons: int, seeds: int, rho: float,
                      alpha: float = ALPHA) -> Rate:
    """The family-wise rate of any false "better"/"worse" when no variant differs: Holm promises at most alpha."""
    rejected = family_rejections(paired_differences(rng, reps, comparisons, seeds, rho), alpha)
    return Rate(float(rejected.any(axis=1).mean()), reps)


def power_at_planned_effect(rng: np.random.Generator, reps: int, comparisons: int, seeds: int, rho: float,
                            alpha: float = ALPHA) -> tuple[float, Rate]:
    """(effect, rate): one variant shifted by the MDE of this design at the true std of the paired differences
    (80% power at alpha / m: the formula alone; what the report prints reads the std from the sweep's own seeds,
    ``power_at_printed_mde``), the others null; the rate at which Holm calls it in the right direction. Holm
    rejects at least what Bonferroni does, so the rate is 80% or a little above."""
    sd = math.sqrt(2 - 2 * rho)
    effect = stats.minimum_detectable_effect(sd, seeds, alpha / comparisons)
    effects = np.zeros(comparisons)
    effects[0] = effect
    differences = paired_differences(rng, reps, comparisons, seeds, rho, effects)
    found = family_rejections(differences, alpha)[:, 0] & (differences[:, 0].mean(axis=1) > 0)
    return effect, Rate(float(found.mean()), reps)


def power_at_planned_seeds(rng: np.random.Generator, reps: int, comparisons: int, effect: float, sd: float,
                           alpha: float = ALPHA) -> tuple[int, float, Rate]:
    """(seeds, promised power, rate): ``--plan``'s seeds for ``effect`` at the true ``sd``, the power it promises
    at that whole number of seeds, and the rate at which Holm finds the effect with them."""
    seeds = stats.seeds_needed(effect, sd, alpha / comparisons)
    promised = stats.power(effect, sd, seeds, alpha / comparisons)
    rho = 0.5
    scale = sd / math.sqrt(2 - 2 * rho)  # unit-variance runs give differences of std sqrt(2 - 2 rho)
    effects = np.zeros(comparisons)
    effects[0] = effect / scale
    differences = paired_differences(rng, reps, comparisons, seeds, rho, effects)
    found = family_rejections(differences, alpha)[:, 0] & (differences[:, 0].mean(axis=1) > 0)
    return seeds, promised, Rate(float(found.mean()), reps)


def power_at_printed_mde(rng: np.random.Generator, reps: int, comparisons: int, seeds: int, rho: float,
                         spread: np.ndarray | None = None, alpha: float = ALPHA) -> tuple[float, Rate]:
    """(median printed MDE / true MDE, rate) of comparison 0, with the std estimated as the report estimates it.
    Each simulated sweep prints its MDE from its own differences (``stats.detectable_effect``, the function the
    report calls); a second sweep of the same design, in which comparison 0 truly differs by that printed MDE and
    the others are null, then asks whether Holm finds it. The rate is the mean power at the printed MDE, over
    what the report would have printed. ``spread``: each comparison's noise scale (``paired_differences``)."""
    spread = np.ones(comparisons) if spread is None else np.asarray(spread, dtype=float)
    level = alpha / comparisons
    printed = stats.detectable_effect(paired_differences(rng, reps, comparisons, seeds, rho, spread=spread)[:, 0],
                                      level)
    true = stats.minimum_detectable_effect(math.sqrt(2 - 2 * rho) * spread[0], seeds, level)
    effects = np.zeros((reps, comparisons))
    effects[:, 0] = printed
    differences = paired_differences(rng, reps, comparisons, seeds, rho, effects, spread)
    found = family_rejections(differences, alpha)[:, 0] & (differences[:, 0].mean(axis=1) > 0)
    return float(np.median(printed) / true), Rate(float(found.mean()), reps)


def power_of_plan_from_pilot(rng: np.random.Generator, reps: int, comparisons: int, pilot_seeds: int,
                             effect: float, sd: float, alpha: float = ALPHA) -> tuple[float, int, Rate]:
    """(median seeds planned, seeds the true ``sd`` needs, rate): ``--plan`` for ``effect`` from a simulated pilot
    of ``pilot_seeds`` whose paired differences have std ``sd`` (``stats.planned_seeds``, the function the plan
    calls, on comparison 0's differences), then a sweep with the planned seeds in which comparison 0 differs by
    ``effect``; the rate at which Holm finds it is the plan's realised (mean) power. A plan beyond
    ``seeds_needed``'s ceiling counts as not found."""
    rho = 0.5
    scale = sd / math.sqrt(2 - 2 * rho)
    level = alpha / comparisons
    pilot = paired_differences(rng, reps, comparisons, pilot_seeds, rho)[:, 0] * scale
    planned = stats.planned_seeds(effect, pilot, level)
    found = np.zeros(reps, dtype=bool)
    effects = np.zeros(comparisons)
    effects[0] = effect / scale
    for seeds in np.unique(planned[~np.isnan(planned)]):  # one simulated batch per planned size
        rows = np.flatnonzero(planned == seeds)
        differences = paired_differences(rng, rows.size, comparisons, int(seeds), rho, effects)
        found[rows] = family_rejections(differences, alpha)[:, 0] & (differences[:, 0].mean(axis=1) > 0)
    return float(np.nanmedian(planned)), stats.seeds_needed(effect, sd, level), Rate(float(found.mean()), reps)


def tost_rates(rng: np.random.Generator, reps: int, seeds: int, margin: float,
               alpha: float = ALPHA) -> tuple[Rate, Rate]:
    """(false equivalence, power): how often two one-sided tests call "equivalent within ±margin" when the true
    difference sits on the margin (at most alpha promised), and when it is 0. Differences have unit std."""
    at_margin = rng.standard_normal((reps, seeds)) + margin
    at_zero = rng.standard_normal((reps, seeds))
    return (Rate(float((stats.tost_p(at_margin, margin) < alpha).mean()), reps),
            Rate(float((stats.tost_p(at_zero, margin) < alpha).mean()), reps))


def sign_flip_size(rng: np.random.Generator, reps: int, seeds: int, alpha: float = ALPHA) -> Rate:
    """How often the exact sign-flip test rejects a true null (heavy-tailed differences: it needs no normality)."""
    differences = rng.standard_t(2, (reps, seeds))
    return Rate(float((stats.sign_flip_p_matrix(differences) < alpha).mean()), reps)


SEQUENTIAL_LOOKS = (3, 6, 9, 12)
SEQUENTIAL_CORRELATIONS = (-0.5, 0.0, 0.5, 0.9, 0.95)


def diverge_one_run(rng: np.random.Generator, differences: np.ndarray) -> np.ndarray:
    """``differences`` with one diverged run per simulated family: at a uniform seed, in a uniform arm (the
    baseline or one of the variants), entered as compare enters it (the worst outcome, an infinite difference
    against its side; a diverged baseline run shifts every comparison of the family). Under the null each
    comparison is as likely to lose the run as to win it."""
    reps, comparisons, seeds = differences.shape
    out = differences.copy()
    seed = rng.integers(0, seeds, reps)
    arm = rng.integers(0, comparisons + 1, reps)  # 0: the baseline
    rows = np.arange(reps)
    base = arm == 0
    out[rows[base], :, seed[base]] = -np.inf
    out[rows[~base], arm[~base] - 1, seed[~base]] = np.inf
    return out


def sequential_family(rng: np.random.Generator, reps: int, comparisons: int, plan: sequential.Plan, rho: float,
                      effects: np.ndarray | None = None,
                      diverged: bool = False) -> tuple[sequential.Decisions, sequential.Evidence]:
    """Simulated families run through the sweep's own looks (``sequential.evidence`` and ``sequential.decide``):
    every seed up to the last look is drawn, and each look reads its first n_k."""
    differences = paired_differences(rng, reps, comparisons, plan.looks[-1], rho, effects)
    if diverged:
        differences = diverge_one_run(rng, differences)
    found = sequential.evidence(differences, plan.looks)
    return sequential.decide(found, plan), found


def sequential_null_error(rng: np.random.Generator, reps: int, comparisons: int, plan: sequential.Plan, rho: float,
                          diverged: bool = False) -> tuple[Rate, float]:
    """(the family-wise rate of any false "better"/"worse" over all looks when no variant differs, the mean paired
    seeds a comparison ran). The design promises the rate is at most alpha."""
    decisions, _ = sequential_family(rng, reps, comparisons, plan, rho, diverged=diverged)
    rate = Rate(float((decisions.state == sequential.REJECTED).any(axis=1).mean()), reps)
    return rate, float(decisions.pairs_used(plan).mean())


def _at_the_mde(rng: np.random.Generator, reps: int, comparisons: int, plan: sequential.Plan, rho: float,
                futility_at: float | None):
    """(effect, promised power, the plan run, decisions, evidence, found in the right direction): one variant
    shifted by the effect a fixed design at the last look's seeds finds with 80% power at alpha / m (``--plan``'s
    promise for that many seeds), the others null, the futility rule's E at ``futility_at`` x that effect (None:
    no futility rule)."""
    sd = math.sqrt(2 - 2 * rho)
    effect = stats.minimum_detectable_effect(sd, plan.looks[-1], plan.alpha / comparisons)
    promised = stats.power(effect, sd, plan.looks[-1], plan.alpha / comparisons)
    effects = np.zeros(comparisons)
    effects[0] = effect
    planned = sequential.Plan(plan.looks, plan.alpha, plan.spending,
                              None if futility_at is None else futility_at * effect, plan.futility_power)
    decisions, found = sequential_family(rng, reps, comparisons, planned, rho, effects)
    rejected = decisions.state[:, 0] == sequential.REJECTED
    crossing = np.maximum(decisions.crossing[:, 0] - 1, 0)
    # The direction at the look whose statistic crossed: a rejection the wrong way is no find.
    right_way = found.direction[np.arange(reps), 0, crossing] > 0
    return effect, promised, planned, decisions, found, Rate(float((rejected & right_way).mean()), reps)


def sequential_power(rng: np.random.Generator, reps: int, comparisons: int, plan: sequential.Plan,
                     rho: float, futility: bool = True) -> tuple[float, float, Rate, float, float]:
    """(effect, promised power, rate, futile share, mean seeds it ran) at the planned effect (``_at_the_mde``),
    the futility rule set at that effect unless ``futility`` is False: the rate at which the looks decide it in
    the right direction. Spending over looks and stopping for futility cost a little of the promise."""
    effect, promised, planned, decisions, _, rate = _at_the_mde(rng, reps, comparisons, plan, rho,
                                                                1.0 if futility else None)
    futile = float((decisions.state[:, 0] == sequential.FUTILE).mean())
    return effect, promised, rate, futile, float(decisions.pairs_used(planned)[:, 0].mean())


def futility_below_the_mde(rng: np.random.Generator, reps: int, fraction: float | None, comparisons: int = 4,
                           rho: float = 0.5) -> tuple[Rate, float, float]:
    """(power at the planned effect, futile share, the share of those futile stops whose |estimate| at the stopping
    look was above E) with the futility rule's E at ``fraction`` of the planned effect (the MDE; None: no futility
    rule, the reference on the same draws when the generator is seeded alike). The rule takes
    the conditional power at max(E, |estimate|): an E below the MDE lets an estimate that fell below the MDE be
    judged at its own size, so a smaller E stops more real effects (statistics-review-4 F3)."""
    _, _, planned, decisions, found, rate = _at_the_mde(rng, reps, comparisons, sequential.Plan(
        SEQUENTIAL_LOOKS, ALPHA), rho, fraction)
    futile = decisions.state[:, 0] == sequential.FUTILE
    at = np.maximum(decisions.look[:, 0] - 1, 0)
    above = np.abs(found.mean[np.arange(len(at)), 0, at]) > (planned.effect_of_interest or math.inf)
    return rate, float(futile.mean()), float((futile & above).sum() / max(futile.sum(), 1))


NOISY_SD, QUIET_SD, EFFECT_OF_INTEREST = 0.0513, 0.0155, 0.03  # the leads: TokenFormer's paired sd, the others'


def sequential_unequal_sd_power(rng: np.random.Generator, reps: int, multiple: float) -> tuple[Rate, float, float]:
    """(rate of deciding, futile share, futile at the first look) for one comparison as noisy as the leads'
    TokenFormer (sd 0.0513) with a true effect of ``multiple`` x E (E = 0.03 nats, below its 12-seed MDE), in a
    family of 7 whose six others are quiet nulls (sd 0.0155): one E for every comparison, as a sweep declares it."""
    sds = np.array([NOISY_SD] + [QUIET_SD] * 6)
    differences = rng.standard_normal((reps, 7, SEQUENTIAL_LOOKS[-1])) * sds[None, :, None]
    differences[:, 0, :] += multiple * EFFECT_OF_INTEREST
    plan = sequential.Plan(SEQUENTIAL_LOOKS, ALPHA, effect_of_interest=EFFECT_OF_INTEREST)
    decisions = sequential.decide(sequential.evidence(differences, plan.looks), plan)
    futile = decisions.state[:, 0] == sequential.FUTILE
    return (Rate(float((decisions.state[:, 0] == sequential.REJECTED).mean()), reps), float(futile.mean()),
            float((futile & (decisions.look[:, 0] == 1)).mean()))


def fixed_looks_error(rng: np.random.Generator, reps: int, comparisons: int, looks: tuple[int, ...],
                      rho: float) -> Rate:
    """Optional stopping without a plan: Holm at alpha at every look, stop at the first verdict (what --add_seeds
    and a new compare do). The family-wise rate the fixed design's report then claims to be alpha."""
    differences = paired_differences(rng, reps, comparisons, looks[-1], rho)
    any_verdict = np.zeros(reps, dtype=bool)
    for n in looks:
        any_verdict |= family_rejections(differences[..., :n], ALPHA).any(axis=1)
    return Rate(float(any_verdict.mean()), reps)


def single_comparison_error(rng: np.random.Generator, reps: int, looks: tuple[int, ...],
                            levels: tuple[float, ...]) -> Rate:
    """One null comparison, the paired t at each look against ``levels``: how often some look rejects."""
    differences = rng.standard_normal((reps, looks[-1]))
    rejected = np.zeros(reps, dtype=bool)
    for n, level in zip(looks, levels, strict=True):
        rejected |= stats.paired_t_p(differences[:, :n]) < level
    return Rate(float(rejected.mean()), reps)


# The two-way interval over seeds x test examples (lit/compare/examples.py): the text suite's structure, from the
# noise study (docs/seed-noise.md): 871 test windows, a paired seed sd of 0.015 and a per-seed test-set SE of the
# paired difference of 0.0017, 80% of the examples' variance shared by every seed (the same window is hard for both).
TEST_EXAMPLES, SEED_SD, TEST_SE, SHARED = 871, 0.015, 0.0017, 0.8
_GRID_CHUNK = 250  # grids at once: 250 x 12 x 871 doubles is 21 MB


def example_grids(rng: np.random.Generator, reps: int, seeds: int, examples: int = 100, seed_sd: float = SEED_SD,
                  test_se: float = TEST_SE, shared: float = SHARED, ar: float = 0.0) -> np.ndarray:
    """Null seeds x examples grids of paired differences, (reps, seeds, examples): a seed effect, a test-example
    effect every seed shares (``shared`` of the examples' variance) and an interaction, the per-seed test-set SE
    ``test_se`` were the examples independent. ``ar``: each example's effects (shared and interaction) follow an
    AR(1) along the examples with this coefficient, as neighbouring windows of one text would; the two-way interval
    assumes independent examples (ar 0)."""
    example_sd = test_se * np.sqrt(examples)
    seed_effect = rng.normal(0, seed_sd, (reps, seeds, 1))
    common = rng.normal(0, example_sd * np.sqrt(shared), (reps, 1, examples))
    own = rng.normal(0, example_sd * np.sqrt(1 - shared), (reps, seeds, examples))
    if ar:
        from scipy import signal

        def correlated(x: np.ndarray) -> np.ndarray:  # stationary AR(1) with x's marginal variance
            x = x.copy()
            x[..., 0] /= math.sqrt(1 - ar ** 2)
            return signal.lfilter([math.sqrt(1 - ar ** 2)], [1, -ar], x, axis=-1)

        common, own = correlated(common), correlated(own)
    return seed_effect + common + own


def two_way_coverage(rng: np.random.Generator, reps: int, seeds: int, confidence: float,
                     **grid: float) -> tuple[Rate, float, float]:
    """(coverage of 0 by the two-way interval on null grids, its mean width over the seed-only t interval's, the
    share of grids where it is the seed-only interval: the "never narrower" guard decided its width)."""
    from scipy import stats as scipy_stats

    from lit.compare import examples

    covered = widths = guarded = 0.0
    for start in range(0, reps, _GRID_CHUNK):
        d = example_grids(rng, min(_GRID_CHUNK, reps - start), seeds, **grid)
        low, high = examples.two_way_intervals(d, confidence)
        _, se, df = examples.two_way_standard_error(d)
        tail = (1 - confidence) / 2
        seed_only = scipy_stats.t.isf(tail, seeds - 1) * d.mean(axis=-1).std(axis=-1, ddof=1) / math.sqrt(seeds)
        covered += float(((low <= 0) & (0 <= high)).sum())
        widths += float(((high - low) / 2 / seed_only).sum())
        guarded += float((scipy_stats.t.isf(tail, df) * se <= seed_only).sum())
    return Rate(covered / reps, reps), widths / reps, guarded / reps


def two_way_report(seed: int = SEED, reps: int = 4_000) -> str:
    """The two-way interval's figures, as the Markdown table docs/comparing-statistics.md shows."""
    rng = np.random.default_rng(seed)
    lines = [f"Simulation seed {seed}, {reps:,} null grids per row, {TEST_EXAMPLES} test examples, paired seed sd "
             f"{SEED_SD}, per-seed test-set SE {TEST_SE} ({SHARED:.0%} of the examples' variance shared by every seed) "
             "unless a row says otherwise; ± is one Monte-Carlo standard error.", "",
             "| seeds | level | examples | covers | width / seed-only | = seed-only interval |",
             "|---|---|---|---|---|---|"]
    rows = [(6, 1 - ALPHA / 24, {}, "independent"), (6, 1 - ALPHA, {}, "independent"),
            (10, 1 - ALPHA / 2, {}, "independent"), (12, 1 - ALPHA / 4, {}, "independent"),
            (10, 1 - ALPHA, {"seed_sd": 0.002, "test_se": 0.004}, "independent, test-set SE 2 × the seed sd"),
            (6, 1 - ALPHA, {"seed_sd": TEST_SE, "ar": 0.5}, "AR(1) 0.5 along the windows, seed sd = test-set SE"),
            (10, 1 - ALPHA, {"seed_sd": TEST_SE, "ar": 0.5}, "AR(1) 0.5 along the windows, seed sd = test-set SE")]
    for seeds, level, grid, what in rows:
        rate, width, guarded = two_way_coverage(rng, reps, seeds, level, examples=TEST_EXAMPLES, **grid)
        lines.append(f"| {seeds} | {level:.2%} | {what} | {rate.rate:.3f} ± {rate.standard_error:.3f} | {width:.2f} | "
                     f"{guarded:.0%} |")
    return "\n".join(lines)


def sequential_report(seed: int = SEED, reps: int = 20_000) -> str:
    """The sequential design's figures, as the Markdown table docs/sequential.md shows."""
    rng = np.random.default_rng(seed)
    plan = sequential.Plan(SEQUENTIAL_LOOKS, ALPHA)
    looks = ", ".join(str(n) for n in SEQUENTIAL_LOOKS)
    lines = [f"Simulation seed {seed}, {reps:,} simulated families per row (single comparisons: {5 * reps:,}), "
             f"alpha = {ALPHA}; ± is one Monte-Carlo standard error. Looks at {looks} paired seeds unless a row "
             "says otherwise; seeds per comparison: the mean paired seeds a comparison ran (the fixed design runs "
             "the last look's).", "",
             "| what | design | simulated | promised | seeds per comparison |", "|---|---|---|---|---|"]
    z = sequential.nominal_levels(SEQUENTIAL_LOOKS, ALPHA)
    for name, levels in (("z levels (the Lan-DeMets boundary as nominal p)", z),
                         ("levels fitted for the paired t", plan.levels(ALPHA))):
        rate = single_comparison_error(rng, 5 * reps, SEQUENTIAL_LOOKS, levels)
        lines.append(f"| one comparison, null, paired t at each look | {name} | {rate.rate:.4f} ± "
                     f"{rate.standard_error:.4f} | ≤ {ALPHA} | — |")
    for comparisons, rho in [(4, r) for r in SEQUENTIAL_CORRELATIONS] + [(12, 0.5)]:
        rate, seeds = sequential_null_error(rng, reps, comparisons, plan, rho)
        lines.append(f"| false verdict, any (group-sequential Holm, null) | m={comparisons}, rho={rho:+.2f} | "
                     f"{rate.rate:.4f} ± {rate.standard_error:.4f} | ≤ {ALPHA} | {seeds:.2f} |")
    for comparisons in (1, 4):
        rate, seeds = sequential_null_error(rng, reps, comparisons, plan, 0.5, diverged=True)
        lines.append(f"| false verdict, any, one diverged run per family | m={comparisons}, rho=+0.50 | "
                     f"{rate.rate:.4f} ± {rate.standard_error:.4f} | ≤ {ALPHA} | {seeds:.2f} |")
    for other in ((3, 6), (4, 8, 12), (2, 4, 6, 8, 10, 12)):
        rate, seeds = sequential_null_error(rng, reps, 4, sequential.Plan(other, ALPHA), 0.5)
        lines.append(f"| false verdict, any (null) | m=4, looks {', '.join(map(str, other))} | {rate.rate:.4f} ± "
                     f"{rate.standard_error:.4f} | ≤ {ALPHA} | {seeds:.2f} |")
    rate, seeds = sequential_null_error(rng, reps, 4, sequential.Plan(SEQUENTIAL_LOOKS, ALPHA, sequential.POCOCK), 0.5)
    lines.append(f"| false verdict, any (null), Pocock-type spending | m=4 | {rate.rate:.4f} ± "
                 f"{rate.standard_error:.4f} | ≤ {ALPHA} | {seeds:.2f} |")
    rate = fixed_looks_error(rng, reps, 4, SEQUENTIAL_LOOKS, 0.5)
    lines.append(f"| for contrast: Holm at alpha at every look, no plan (null) | m=4 | {rate.rate:.4f} ± "
                 f"{rate.standard_error:.4f} | ≤ {ALPHA} (claimed) | — |")
    obf, pocock = sequential.OBRIEN_FLEMING, sequential.POCOCK
    for comparisons, rho, spending, futility in ((1, 0.5, obf, True), (4, 0.5, obf, True), (4, 0.9, obf, True),
                                                 (12, 0.5, obf, True), (4, 0.5, obf, False), (4, 0.5, pocock, True),
                                                 (4, 0.5, pocock, False)):
        effect, promised, rate, futile, seeds = sequential_power(
            rng, reps, comparisons, sequential.Plan(SEQUENTIAL_LOOKS, ALPHA, spending), rho, futility)
        kind = ("" if spending == obf else ", Pocock-type") + (", futility at it" if futility else ", no futility")
        lines.append(f"| power at the planned effect ({effect:.3g} σ_run){kind} | m={comparisons}, "
                     f"rho={rho:+.2f} | {rate.rate:.4f} ± {rate.standard_error:.4f} (futile {futile:.3f}) | "
                     f"{promised:.2f} (fixed, {SEQUENTIAL_LOOKS[-1]} seeds) | {seeds:.2f} |")
    futile_plan = sequential.Plan(SEQUENTIAL_LOOKS, ALPHA, effect_of_interest=stats.minimum_detectable_effect(
        1.0, SEQUENTIAL_LOOKS[-1], ALPHA / 4))
    rate, seeds = sequential_null_error(rng, reps, 4, futile_plan, 0.5)
    lines.append(f"| false verdict, any (null), futility at the planned effect | m=4, rho=+0.50 | {rate.rate:.4f} ± "
                 f"{rate.standard_error:.4f} | ≤ {ALPHA} | {seeds:.2f} |")
    # Futility's E below the planned effect, on the same draws as each other (a fresh generator of the same seed):
    # the difference between the rows is the rule's cost, with less Monte-Carlo error than each row's own.
    planned_effect = stats.minimum_detectable_effect(1.0, SEQUENTIAL_LOOKS[-1], ALPHA / 4)  # rho 0.5: sd 1
    for fraction in (None, 1.0, 0.5, 0.25):
        rate, futile, above = futility_below_the_mde(np.random.default_rng(seed), reps, fraction)
        e = "no futility" if fraction is None else f"futility at E = {fraction:g} × it"
        lines.append(f"| power at the planned effect ({planned_effect:.3g} σ_run), {e}, same draws | m=4, rho=+0.50 | "
                     f"{rate.rate:.4f} ± {rate.standard_error:.4f} (futile {futile:.3f}"
                     + ("" if fraction is None else f", {above:.0%} of them with \\|estimate\\| > E")
                     + ") | 0.80 (fixed, 12 seeds) | — |")
    for multiple in (2, 3):  # unequal sds: one E for a noisy comparison among quiet ones (statistics-review-3 D2)
        rate, futile, first = sequential_unequal_sd_power(rng, reps, multiple)
        lines.append(f"| decided, true effect {multiple}E (E = {EFFECT_OF_INTEREST}) on a comparison of sd "
                     f"{NOISY_SD} among six nulls of sd {QUIET_SD}, futility at E | m=7, unequal sds | "
                     f"{rate.rate:.4f} ± {rate.standard_error:.4f} (futile {futile:.3f}, at look 1 {first:.3f}) | "
                     f"— | — |")
    return "\n".join(lines)


def report(seed: int = SEED, reps: int = 20_000) -> str:
    """Every figure of the calibration, as the Markdown table docs/comparing-statistics.md shows."""
    rng = np.random.default_rng(seed)
    lines = [f"Simulation seed {seed}, {reps:,} simulated families per row, alpha = {ALPHA}; ± is one Monte-Carlo "
             "standard error.", "",
             "| what | design | simulated | promised |", "|---|---|---|---|"]
    for comparisons, seeds in ((4, 3), (4, 6), (12, 8)):
        for rho in CORRELATIONS:
            rate = null_family_error(rng, reps, comparisons, seeds, rho)
            lines.append(f"| false verdict, any (Holm, null) | m={comparisons}, n={seeds}, rho={rho:+.2f} | "
                         f"{rate.rate:.4f} ± {rate.standard_error:.4f} | ≤ {ALPHA} |")
    for comparisons, seeds in ((4, 3), (4, 6), (12, 8)):
        for rho in (0.0, 0.9):
            effect, rate = power_at_planned_effect(rng, reps, comparisons, seeds, rho)
            lines.append(f"| power at the MDE, σ known ({effect:.3g} σ_run) | m={comparisons}, n={seeds}, "
                         f"rho={rho:+.2f} | {rate.rate:.4f} ± {rate.standard_error:.4f} | 0.80 |")
    for effect in (0.5, 1.0):
        seeds, promised, rate = power_at_planned_seeds(rng, reps, 4, effect, 1.0)
        lines.append(f"| power with --plan's seeds, σ known (effect {effect} σ_diff) | m=4, n={seeds} planned | "
                     f"{rate.rate:.4f} ± {rate.standard_error:.4f} | {promised:.4f} |")
    # What the report prints: the std estimated from the sweep's own seeds (the 80% upper confidence limit).
    for comparisons, seeds, rho, spread in ((24, 3, 0.0, None), (24, 6, 0.0, None), (24, 10, 0.0, None),
                                            (4, 3, 0.5, None), (4, 3, 0.0, (2.0, 1.0, 1.0, 1.0))):
        ratio, rate = power_at_printed_mde(rng, reps, comparisons, seeds, rho, spread)
        row = ", its noisiest row (2x the others' σ_diff)" if spread else ""
        lines.append(f"| mean power at the printed MDE, σ estimated as the report does (printed / true MDE: median "
                     f"{ratio:.2f}) | m={comparisons}, n={seeds}, rho={rho:+.2f}{row} | "
                     f"{rate.rate:.4f} ± {rate.standard_error:.4f} | ≥ 0.75 |")
    for comparisons, pilot, effect, sd in ((24, 3, 0.03, 0.02), (24, 6, 0.03, 0.02), (4, 3, 1.0, 1.0)):
        median, true_seeds, rate = power_of_plan_from_pilot(rng, reps, comparisons, pilot, effect, sd)
        lines.append(f"| power of --plan from a {pilot}-seed pilot (effect {effect / sd:g} σ_diff; median {median:g} "
                     f"seeds planned, {true_seeds} at the true σ) | m={comparisons}, pilot n={pilot} | "
                     f"{rate.rate:.4f} ± {rate.standard_error:.4f} | ≥ 0.80 |")
    for seeds, margin in ((6, 1.0), (10, 0.5)):
        false, power = tost_rates(rng, reps, seeds, margin)
        lines.append(f"| TOST: equivalent when the truth is on the margin | n={seeds}, margin {margin} σ_diff | "
                     f"{false.rate:.4f} ± {false.standard_error:.4f} | ≤ {ALPHA} |")
        lines.append(f"| TOST: equivalent when the truth is 0 | n={seeds}, margin {margin} σ_diff | "
                     f"{power.rate:.4f} ± {power.standard_error:.4f} | (power) |")
    for seeds in (6, 8):
        rate = sign_flip_size(rng, reps, seeds)
        lines.append(f"| sign-flip test, null, t(2) noise | n={seeds} | {rate.rate:.4f} ± {rate.standard_error:.4f} "
                     f"| ≤ {ALPHA} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lit.compare.calibration", description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--reps", type=int, default=20_000)
    parser.add_argument("--sequential", action="store_true",
                        help="the sequential design's figures (docs/sequential.md) instead of the fixed design's")
    parser.add_argument("--two_way", action="store_true",
                        help="the interval over seeds x test examples (docs/comparing-statistics.md; --reps 4000)")
    args = parser.parse_args(argv)
    print(sequential_report(args.seed, args.reps) if args.sequential
          else two_way_report(args.seed, args.reps) if args.two_way else report(args.seed, args.reps))


if __name__ == "__main__":
    main()
