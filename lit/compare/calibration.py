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
    args = parser.parse_args(argv)
    print(report(args.seed, args.reps))


if __name__ == "__main__":
    main()
