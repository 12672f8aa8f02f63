"""Calibration of compare's statistics by simulation: does the report err as often as it says, and no more?

Variants that differ from the baseline only by seed noise, with paired correlation rho between a variant's run and
the baseline's run of the same seed (the shared data order makes it positive; different inits can make it
anything). Every variant shares the baseline's runs, so the family's tests are correlated, as in a real sweep. The
same functions the report runs (``stats.paired_t_p``, ``stats.holm_matrix``, ``stats.tost_p``,
``stats.sign_flip_p_matrix``, ``stats.minimum_detectable_effect``, ``stats.seeds_needed``) run here on a matrix
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
                       effects: np.ndarray | None = None) -> np.ndarray:
    """Simulated variant - baseline per seed, shape (reps, comparisons, seeds): unit-variance runs, a variant's
    run correlated ``rho`` with the baseline's run of its seed, ``effects`` (per comparison) added to the variants."""
    baseline = rng.standard_normal((reps, 1, seeds))
    own = rng.standard_normal((reps, comparisons, seeds))
    variants = rho * baseline + math.sqrt(1 - rho ** 2) * own
    if effects is not None:
        variants = variants + np.asarray(effects, dtype=float)[None, :, None]
    return variants - baseline


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
    """(effect, rate): one variant shifted by the MDE the report would print for this design (80% power at
    alpha / m, from the true std of the paired differences), the others null; the rate at which Holm calls it
    in the right direction. Holm rejects at least what Bonferroni does, so the rate is 80% or a little above."""
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
            lines.append(f"| power at the printed MDE ({effect:.3g} σ_run) | m={comparisons}, n={seeds}, "
                         f"rho={rho:+.2f} | {rate.rate:.4f} ± {rate.standard_error:.4f} | 0.80 |")
    for effect in (0.5, 1.0):
        seeds, promised, rate = power_at_planned_seeds(rng, reps, 4, effect, 1.0)
        lines.append(f"| power with --plan's seeds (effect {effect} σ_diff) | m=4, n={seeds} planned | "
                     f"{rate.rate:.4f} ± {rate.standard_error:.4f} | {promised:.4f} |")
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
