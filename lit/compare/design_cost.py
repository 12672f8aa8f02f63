"""What a design decides and what it costs, in one family: a sequential sweep against fixed seed counts.

A sequential sweep spends seeds only while a comparison is open, so its cost is a random number, and so is the
number of comparisons it decides; a fixed design's cost is known and its decisions are random. They compare like for
like only in the same family (the same comparisons under the same multiplicity rule), at the same true effects,
costed at the same run times. This module simulates that: each comparison's per-seed paired differences are drawn
normal around a true mean with a true sd, independently across comparisons (as in the review that first drew this
table) or with a correlation between them (a shared baseline as noisy as each variant gives 0.5), and every
simulated family goes through the very code a sweep and a report run: ``sequential.evidence``/``sequential.decide``
for the looks, and compare's paired t with Holm (``calibration.family_rejections``) for a fixed design.

Cost, in core-hours: the tuning runs (the same for every design), plus each variant's seed runs at its own
per-seed time, plus the baseline's seeds. The baseline runs as many seeds as its longest-running comparison
(what a sequential sweep does: it runs the baseline while any comparison is open), so a fixed design of n seeds
pays n for every arm.

A decision is a "better" or "worse" verdict: a rejection in either direction, counted as a report would print it.

``python -m benchmarks.reproduction_leads --design-table`` feeds it the leads sweep's own estimates and writes
docs/reproduction/leads-compute.md; statistics-review-3 (D4) drew the first such table with its own scripts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lit.compare.calibration import family_rejections
from lit.statistics import sequential


@dataclass(frozen=True)
class Arm:
    """One comparison of the family, taken as the truth: the mean and sd of its per-seed paired differences, and
    what one seed run of the variant costs (core-hours)."""

    label: str
    effect: float
    sd: float
    seed_hours: float


@dataclass(frozen=True)
class Family:
    """The comparisons, the baseline's cost per seed run, and the tuning runs' cost (common to every design)."""

    arms: tuple[Arm, ...]
    baseline_seed_hours: float
    tuning_hours: float

    def scaled(self, factor: float) -> Family:
        """The same family with every true effect times ``factor`` (half of what was seen: regression to the
        mean after a selection by the largest estimates)."""
        arms = tuple(Arm(a.label, a.effect * factor, a.sd, a.seed_hours) for a in self.arms)
        return Family(arms, self.baseline_seed_hours, self.tuning_hours)


@dataclass(frozen=True)
class Estimate:
    """A simulated mean with its Monte-Carlo standard error."""

    mean: float
    standard_error: float

    @classmethod
    def of(cls, values: np.ndarray) -> Estimate:
        values = np.asarray(values, dtype=float)
        spread = float(values.std(ddof=1)) if values.size > 1 else 0.0
        return cls(float(values.mean()), spread / math.sqrt(values.size))


@dataclass(frozen=True)
class Outcome:
    """What a design gave over the simulated families: decisions and core-hours per family."""

    design: str
    decisions: Estimate
    core_hours: Estimate


def draw(rng: np.random.Generator, family: Family, reps: int, seeds: int, correlation: float = 0.0) -> np.ndarray:
    """Per-seed paired differences, shape (reps, comparisons, seeds); at each seed every two comparisons' noise
    correlates ``correlation`` (at least 0: what they share is the baseline's run of that seed)."""
    effects = np.array([a.effect for a in family.arms])
    sds = np.array([a.sd for a in family.arms])
    shared = rng.standard_normal((reps, 1, seeds))
    own = rng.standard_normal((reps, len(family.arms), seeds))
    noise = math.sqrt(correlation) * shared + math.sqrt(1 - correlation) * own
    return effects[None, :, None] + sds[None, :, None] * noise


def cost(family: Family, pairs: np.ndarray) -> np.ndarray:
    """Core-hours of each simulated family, from the paired seeds each comparison ran, shape (reps, comparisons):
    tuning, each variant's seeds, and the baseline's seeds (as many as its longest-running comparison)."""
    seed_hours = np.array([a.seed_hours for a in family.arms])
    pairs = np.asarray(pairs, dtype=float)
    return family.tuning_hours + (pairs * seed_hours).sum(axis=-1) + pairs.max(axis=-1) * family.baseline_seed_hours


def sequential_outcome(differences: np.ndarray, family: Family, plan: sequential.Plan) -> Outcome:
    """The sweep's looks over ``differences`` (every seed up to the last look drawn; look k reads the first n_k)."""
    decisions = sequential.decide(sequential.evidence(differences[..., :plan.looks[-1]], plan.looks), plan)
    rejected = (decisions.state == sequential.REJECTED).sum(axis=1)
    looks = ", ".join(map(str, plan.looks))
    futility = (f"futility at {plan.effect_of_interest:g}" if plan.effect_of_interest else "no futility")
    return Outcome(f"sequential (looks {looks}, {futility})", Estimate.of(rejected),
                   Estimate.of(cost(family, decisions.pairs_used(plan))))


def fixed_outcome(differences: np.ndarray, family: Family, seeds: int, alpha: float) -> Outcome:
    """A fixed design of ``seeds`` paired seeds per comparison, Holm over the family at ``alpha`` (compare's
    verdicts); its cost is the same in every family."""
    rejected = family_rejections(differences[..., :seeds], alpha).sum(axis=1)
    pairs = np.full(differences.shape[:2], seeds)
    return Outcome(f"fixed, {seeds} seeds", Estimate.of(rejected), Estimate.of(cost(family, pairs)))


def compare_designs(family: Family, plan: sequential.Plan, fixed_seeds: Sequence[int], reps: int,
                    seed: int, correlation: float = 0.0) -> list[Outcome]:
    """The sequential design (with the plan's futility and without it) and each fixed design, all on the same
    simulated families (common random numbers: their differences are measured more precisely than each alone)."""
    rng = np.random.default_rng(seed)
    differences = draw(rng, family, reps, max(plan.looks[-1], *fixed_seeds), correlation)
    outcomes = [sequential_outcome(differences, family, plan)]
    if plan.effect_of_interest:
        without = sequential.Plan(plan.looks, plan.alpha, plan.spending, None, plan.futility_power)
        outcomes.append(sequential_outcome(differences, family, without))
    outcomes += [fixed_outcome(differences, family, n, plan.alpha) for n in fixed_seeds]
    return outcomes


def table(outcomes: Sequence[Outcome], reference: str, comparisons: int) -> str:
    """Markdown rows: each design's expected decisions and core-hours, and both as a share of those of the design
    named ``reference``."""
    ref = next(o for o in outcomes if o.design == reference)
    lines = [f"| design, same family of {comparisons} | expected decisions | expected core-hours | decisions, share "
             f"of {reference} | core-hours, share of {reference} |", "|---|---|---|---|---|"]
    for o in outcomes:
        lines.append(f"| {o.design} | {o.decisions.mean:.2f} ± {o.decisions.standard_error:.2f} | "
                     f"{o.core_hours.mean:.2f} ± {o.core_hours.standard_error:.2f} | "
                     f"{o.decisions.mean / ref.decisions.mean:.0%} | {o.core_hours.mean / ref.core_hours.mean:.0%} |")
    return "\n".join(lines)
