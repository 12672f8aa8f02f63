"""The comparisons of a family, checked where plausible bugs slipped past the other tests (statistics review 2,
mutants M6, M7, M10 and M15): each test here fails on its mutant.

- M6: a parity verdict read from the unadjusted equivalence p;
- M7: a diverged seed counted as the best outcome of an accuracy (the worst side ignoring the metric's direction);
- M10: the equivalence family taking the other sweeps' difference p-values instead of their equivalence p-values;
- M15: the interval's level computed over this sweep's tests only, not the whole family.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from scipy import optimize

from lit.compare import stats
from lit.compare.analysis import EQUIVALENT, NOT_EQUIVALENT, VariantResult, compare_to_baseline, paired_outcomes

SEEDS = [str(s) for s in range(6)]
NOISE = np.array([0.3, -1.1, 0.8, -0.2, 1.4, -1.2])  # a fixed pattern of paired differences, mean 0
BASE = {s: 2.0 + 0.01 * i for i, s in enumerate(SEEDS)}
SWEEP = SimpleNamespace(protocol={}, sweep_id="this")


def result(label: str, values: dict[str, float], diverged: dict[str, int | None] | None = None) -> VariantResult:
    return VariantResult(label=label, overrides=label, values=values,
                         summary=stats.summarize(list(values.values()), 0.95) if values else None, tuned=None,
                         parameters=None, throughput=None, throughput_metric=None, relative_throughput=None,
                         items_per_step=None, spike_count=None,
                         curve=pd.DataFrame(columns=["step", "mean", "std", "n"]), diverged=diverged or {})


def with_differences(label: str, differences: np.ndarray) -> VariantResult:
    return result(label, {s: BASE[s] + float(d) for s, d in zip(SEEDS, differences, strict=True)})


def tost(differences: np.ndarray, margin: float) -> float:
    return float(stats.tost_p(differences[None, :], margin)[0])


def differences_with_tost_p(target: float, margin: float, shift: float = 0.001) -> np.ndarray:
    """Paired differences (the fixed noise pattern about a small shift, scaled) whose equivalence p is ``target``:
    spread enough that the difference test finds nothing."""
    scale = optimize.brentq(lambda k: tost(shift + k * NOISE, margin) - target, 1e-6, 1.0)
    return shift + scale * NOISE


def test_m6_parity_reads_the_holm_adjusted_equivalence_p():
    margin = 0.02
    a, b = differences_with_tost_p(0.04, margin), differences_with_tost_p(0.03, margin)
    variants = [result("base", BASE), with_differences("a", a), with_differences("b", b)]
    comparisons, _ = compare_to_baseline(variants, variants[0], 0.95, "min", (margin, ["a", "b"]), {}, SWEEP)
    by = {c.label: c for c in comparisons}
    for label, raw in (("a", 0.04), ("b", 0.03)):
        e = by[label].equivalence
        assert e.p_value == pytest.approx(raw) and e.p_adjusted == pytest.approx(0.06)  # Holm over the two
        # raw p < 0.05 but adjusted >= 0.05: not shown equivalent (the mutant calls both equivalent)
        assert e.verdict == NOT_EQUIVALENT != EQUIVALENT.format(margin=margin)


def test_m7_a_diverged_seed_is_the_worst_outcome_whichever_way_the_metric_goes():
    accuracy = {s: 0.8 for s in SEEDS}
    variant = result("v", {s: 0.81 for s in SEEDS[1:]}, diverged={SEEDS[0]: 40})
    base = result("base", accuracy)
    assert paired_outcomes(variant, base, "max")[SEEDS[0]] == -math.inf  # an accuracy: a diverged run scores worst
    assert paired_outcomes(variant, base, "min")[SEEDS[0]] == math.inf  # a loss: likewise, the other sign
    flipped = result("base", {s: 0.8 for s in SEEDS[1:]}, diverged={SEEDS[0]: 40})
    assert paired_outcomes(result("v", accuracy), flipped, "max")[SEEDS[0]] == math.inf
    # In the test it takes the largest rank against the variant: five tied gains (ranks 1-5) minus 6, not plus 6.
    comparisons, _ = compare_to_baseline([base, variant], base, 0.95, "max", None, {}, SWEEP)
    assert comparisons[0].test == "sign-flip" and stats.signed_rank_sum(list(comparisons[0].outcomes.values())) == 9


def test_m10_the_equivalence_family_takes_the_other_sweeps_equivalence_p():
    margin = 0.02
    mine = differences_with_tost_p(0.01, margin)
    variants = [result("base", BASE), with_differences("a", mine)]
    # The other sweep: its differences clearly decided (tiny p), its parity claims clearly not shown (large p).
    others = {"other": ([1e-6, 1e-6], [0.9, 0.9])}
    comparisons, family = compare_to_baseline(variants, variants[0], 0.95, "min", (margin, ["a"]), others, SWEEP)
    assert comparisons[0].equivalence.p_adjusted == pytest.approx(stats.holm([0.01, 0.9, 0.9])[0])  # 0.03
    assert family.size == 3  # the difference family: this sweep's test and the other sweep's two


def test_m15_the_interval_level_is_the_family_s_holm_level():
    alpha = 0.05
    differences = 0.01 + 0.004 * NOISE
    variants = [result("base", BASE), with_differences("a", differences)]
    others = {"other": ([1e-4, 0.5, 0.7], [])}
    comparisons, _ = compare_to_baseline(variants, variants[0], 1 - alpha, "min", None, others, SWEEP)
    c = comparisons[0]
    family = [c.p_adjusted and float(stats.paired_t_p(differences[None, :])[0]), 1e-4, 0.5, 0.7]
    assert c.level == pytest.approx(stats.holm_levels(family, alpha)[0])
    assert c.level != pytest.approx(stats.holm_levels(family[:1], alpha)[0])  # the mutant's level
    s = c.paired.summary
    assert c.interval == pytest.approx(stats.t_interval(s.mean, s.std / math.sqrt(s.n), s.n - 1, 1 - c.level))
