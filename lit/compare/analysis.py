"""A sweep turned into the numbers of its report: per-variant summaries and outcomes, paired tests against the
baseline within the sweep's family (Holm, BH, intervals in step with Holm, the minimum detectable effect, equivalence
for parity claims), steps to each baseline seed's final value, throughput, and the depth profile when logged.

Everything here is a pure function of a ``Sweep`` (no MLflow, no files), so the report and the plots show
the same numbers and the tests can check them against a computation by hand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from lit.compare import examples, stats
from lit.compare.runs import Sweep, is_throughput_metric
from lit.compare.sequential_report import sequential_verdicts
from lit.errors import UserInputError
from lit.statistics.sequential import SequentialResult
from lit.sweep import protocol
from lit.tracking.names import SPIKE_COUNT as SPIKE_METRIC
from lit.tracking.names import STREAM_RMS_PREFIX, SUBLAYER

NEEDS_SEEDS = "needs ≥2 seeds for an interval"
NEEDS_PAIRS = "needs ≥2 paired seeds for a test"
NO_COMMON_SEED = "no seed in common with the baseline"
ALL_TUNING_DIVERGED = "diverged at every tuning value"
T_TEST, SIGN_FLIP = "paired t", "sign-flip"
EQUIVALENT, NOT_EQUIVALENT, DIFFERENT = "equivalent within ±{margin:g}", "not shown equivalent", "different"
PROPORTIONS = ("acc", "top", "f1", "auc", "auroc", "map", "iou", "miou", "dice", "precision", "recall", "error",
               "err")  # metrics that live in [0, 1] when their values do
COLLAPSE_FRACTION = 0.5  # a bounded seed closer to the worst value than this share of the baseline's median is


@dataclass(frozen=True)
class VariantResult:
    """One variant's counted seed runs: the final metric per finished seed, the diverged ones, and what else the
    runs logged."""

    label: str
    overrides: str
    values: dict[str, float]  # seed -> the metric at the run's last logged step (finished runs)
    summary: stats.Summary | None  # None when none of its runs finished
    tuned: str | None  # the tuned value its final runs ran with (one, or several joined by ", ")
    parameters: float | None
    throughput: float | None  # items/s: median over each run's history, mean over seeds
    throughput_metric: str | None
    relative_throughput: float | None  # / the baseline's
    items_per_step: float | None
    spike_count: float | None
    curve: pd.DataFrame  # stats.mean_curve of the curve metric (``Analysis.curve_metric``): step, mean, std, n
    diverged: dict[str, int | None] = field(default_factory=dict)  # seed -> first non-finite step (diverged runs)
    collapsed: tuple[str, ...] = ()  # finished seeds whose bounded metric collapsed (``collapsed_seeds``)
    tuning_diverged: tuple[int, int] = (0, 0)  # (tuning runs that diverged, tuning runs found)
    seed_curves: dict[str, pd.DataFrame] = field(default_factory=dict)  # seed -> step, value of the curve metric

    @property
    def diverged_at_every_tuning_value(self) -> bool:
        return self.tuning_diverged[1] > 0 and self.tuning_diverged[0] == self.tuning_diverged[1]


@dataclass(frozen=True)
class Equivalence:
    """A parity claim's two one-sided tests: is the mean difference within ±margin of the baseline?"""

    margin: float
    p_value: float | None  # the larger one-sided p; None when it cannot be computed
    p_adjusted: float | None  # Holm over the parity claims of the family
    verdict: str


@dataclass(frozen=True)
class Comparison:
    """A variant against the baseline. ``paired`` is the t side (finished pairs only); ``outcomes`` every seed
    both have, a diverged run entering as the worst outcome (an infinite difference) in the sign-flip test."""

    label: str
    paired: stats.Paired
    p_adjusted: float | None  # Holm, of the test the verdict rests on
    verdict: str
    outcomes: dict[str, float] = field(default_factory=dict)  # seed -> difference (±inf: one side diverged)
    excluded: tuple[str, ...] = ()  # seeds left out of the t-test because a run diverged
    p_sign_flip: float | None = None
    test: str | None = None  # T_TEST or SIGN_FLIP: the test the verdict rests on
    q_value: float | None = None  # Benjamini-Hochberg over the family
    level: float | None = None  # the per-comparison level of ``interval`` (Holm's level at this comparison)
    interval: tuple[float, float] | None = None  # excludes 0 exactly when the Holm verdict says different
    mde: float | None = None  # at 80% power and the family's alpha / m, from the paired sd's upper limit
    equivalence: Equivalence | None = None
    correlation: float | None = None  # Pearson, variant vs baseline values over the finished paired seeds (n >= 3)
    two_way: tuple[float, float] | None = None  # at the interval's level, resampling seeds and test examples


@dataclass(frozen=True)
class Speedup:
    """Steps-to-target per seed: how much sooner the variant reaches each baseline seed's final value than that
    baseline seed did (the baseline is 1.00 by construction). A seed whose variant never reached the target is
    right-censored in steps, so its speedup is known only as an upper bound (``bounds``): it counts, as the
    evidence of "slower" it is, in the median, its interval and the sign test (``stats.censored_median``)."""

    label: str
    seeds: int  # paired seeds considered
    steps: dict[str, float | None]  # seed -> the variant's first step at the target (None: not reached)
    ratios: dict[str, float]  # seed -> baseline seed's step / the variant's step (where both are > 0)
    bounds: dict[str, float] = field(default_factory=dict)  # seed not reached -> baseline step / variant's last step
    summary: stats.CensoredMedian | None = None  # median, its distribution-free interval, the sign test
    tokens: float | None = None  # median step x items per step, a not-reached seed at its last step
    tokens_bounded: bool = False  # the median step falls on a seed that never reached: at least this many

    @property
    def reached(self) -> int:
        return sum(step is not None for step in self.steps.values())

    @property
    def median(self) -> float | None:
        return None if self.summary is None else self.summary.median

    @property
    def interval(self) -> tuple[float, float] | None:
        return None if self.summary is None else self.summary.interval


@dataclass(frozen=True)
class DepthProfile:
    """RMS of the residual stream after each sublayer, mean over seeds, at the first and the last logged step."""

    first: dict[str, pd.Series]  # label -> RMS indexed by sublayer name, in stream order
    last: dict[str, pd.Series]
    first_steps: tuple[float, ...]  # the distinct steps the first profiles come from (one, when runs agree)
    last_steps: tuple[float, ...]


@dataclass(frozen=True)
class Family:
    """The multiple-comparison family: Holm and BH run over every tested comparison of every sweep in it."""

    name: str
    sweeps: tuple[str, ...]  # sweep ids whose comparisons are in the family (this one first)
    size: int  # tested comparisons in the family (m)
    declared: bool  # named in the protocol (else: one family per sweep, by default)


@dataclass(frozen=True)
class SharedValue:
    """The secondary comparison: per variant, its runs at the baseline's tuned value against the baseline's."""

    key: str  # the tuned key, as a label shows it ("lr")
    value: str | None  # the baseline's tuned value: what every run here ran with
    comparisons: tuple[Comparison, ...]  # as the primary ones, over the runs at the baseline's value
    family: Family | None  # Holm over these comparisons alone
    own_value: dict[str, str | None]  # label -> the variant's own tuned value (its primary runs')
    reused: dict[str, int]  # label -> runs here that are its seed runs (it picked the baseline's value itself)
    primary_sd: dict[str, float | None]  # label -> std of the paired differences at its own value (the primary's)
    missing: tuple[str, ...] = ()  # variants with no counted run at the baseline's value
    note: str | None = None  # why nothing is compared


@dataclass(frozen=True)
class Analysis:
    sweep: Sweep
    metric: str
    mode: str  # "min": lower is better; "max": higher is better
    mode_source: str  # where the direction came from, in words
    confidence: float
    baseline: str
    variants: list[VariantResult]
    comparisons: list[Comparison]
    target: float  # the baseline's final mean
    targets: list[Speedup]
    baseline_std: float | None
    median_half_width: float | None  # of the unadjusted paired-difference intervals (for the printed decimals)
    depth: DepthProfile | None
    without_metric: int  # counted runs that never logged the metric
    family: Family
    bounded: bool  # the metric is a proportion in [0, 1]: logit intervals, collapses shown
    equivalence_margin: float | None = None
    curve_metric: str = ""  # what the curves and steps to target read (``curve_metric``); "" means ``metric``
    examples_per_run: tuple[int, ...] = ()  # the test examples each run was scored on (its per-example artifact)
    sequential: SequentialResult | None = None  # a sequential sweep's looks, replayed (lit/statistics/sequential.py)
    sequential_notes: tuple[str, ...] = ()  # what the report must say about them
    shared_value: SharedValue | None = None  # --shared_value: the secondary comparison (lit/compare/shared_value.py)

    @property
    def curve_of(self) -> str:
        return self.curve_metric or self.metric

    @property
    def protocol(self) -> dict:
        return self.sweep.protocol

    @property
    def alpha(self) -> float:
        return 1 - self.confidence

    @property
    def mde_alpha(self) -> float:
        """Holm's strictest per-comparison level, alpha / m: the MDE holds at every step of the family."""
        return self.alpha / max(1, self.family.size)


known_mode = protocol.known_mode  # the one rule, shared with sweep and ladders (lit/sweep/protocol.py)


def metric_direction(spec: dict, metric: str, mode: str | None = None) -> tuple[str, str]:
    """(``"min"`` or ``"max"``, where it came from): ``--mode``, else the protocol's mode when the metric is the
    sweep's own (tuning or report metric), else the name's known direction. An unknown name without a mode is a
    user error: guessing would flip every verdict of a higher-is-better metric."""
    if mode is not None:
        return mode, "--mode"
    known = known_mode(metric)
    declared = spec.get("mode") in stats.MODES
    if declared and metric == spec.get("metric"):
        return spec["mode"], "the sweep's protocol"
    # The protocol's mode is declared for the tuning metric; the report metric shares it when it is the same
    # quantity on another split (val/loss, test/loss) or has no known direction of its own.
    same_quantity = metric.rsplit("/", 1)[-1] == str(spec.get("metric", "")).rsplit("/", 1)[-1]
    if declared and metric == spec.get("report_metric") and (same_quantity or known is None):
        return spec["mode"], "the sweep's protocol"
    if known is None:
        raise UserInputError(f"the direction of {metric!r} is not known (is lower or higher better?); pass --mode min "
                             "or --mode max (or run the sweep with --mode, which records it in its protocol)")
    return known, "the metric's name"


def is_bounded(metric: str, values: list[float]) -> bool:
    """A proportion (accuracy, F1, ...) whose values all lie in [0, 1]; an accuracy logged in percent is not."""
    name = metric.rsplit("/", 1)[-1].lower()
    return bool(values) and name.startswith(PROPORTIONS) and all(0 <= v <= 1 for v in values)


def variant_labels(sweep: Sweep) -> list[str]:
    """The protocol's variants in its order, then any label only the runs carry (a hand-added run)."""
    labels = [v["label"] for v in sweep.protocol.get("variants", [])]
    return labels + sorted(set(sweep.runs["variant"]) - set(labels))


def family_name(spec: dict, sweep_id: str) -> tuple[str, bool]:
    """The protocol's family and whether it declared one (sweeps without one are a family of their own)."""
    name = spec.get("family")
    return (str(name), True) if name else (sweep_id, False)


def analyze(sweep: Sweep, metric: str, baseline: str | None, confidence: float, mode: str | None = None,
            equivalence: tuple[float, list[str]] | None = None,
            family_tests: dict[str, tuple[list[float], list[float]]] | None = None) -> Analysis:
    """All the numbers of the report. ``baseline`` None means the protocol's baseline; ``mode`` None the
    protocol's or the metric's direction; ``equivalence`` (margin, parity labels) overrides the protocol's;
    ``family_tests`` the (difference p-values, equivalence p-values) of the other sweeps of this one's family,
    by sweep id, which Holm and BH take in with this sweep's."""
    labels = variant_labels(sweep)
    baseline = baseline or sweep.protocol.get("baseline") or labels[0]
    if baseline not in labels:
        raise UserInputError(f"{baseline!r} is not a variant of sweep {sweep.sweep_id}; pass one of its labels to "
                             f"--baseline: {', '.join(labels)}")
    mode, mode_source = metric_direction(sweep.protocol, metric, mode)
    if equivalence is None and sweep.protocol.get("equivalence"):
        declared = sweep.protocol["equivalence"]
        equivalence = (float(declared["margin"]), list(declared.get("variants") or []))
    history = {key: points for key, points in sweep.history.groupby("key")}
    metric_points = history.get(metric, sweep.history.iloc[0:0])
    finished = sweep.runs[sweep.runs["run_id"].isin(set(metric_points["run_id"]))]
    diverged = sweep.runs[sweep.runs["outcome"] == protocol.DIVERGED_OUTCOME]
    bounded = is_bounded(metric, [stats.final_value(p) for _, p in metric_points.groupby("run_id")])
    overrides = {v["label"]: describe_overrides(v.get("overrides")) for v in sweep.protocol.get("variants", [])}
    along = curve_metric(sweep.protocol, metric, history)
    variants = [_variant(label, finished[finished["variant"] == label], diverged[diverged["variant"] == label],
                         history, metric, along, overrides.get(label, ""), confidence, bounded, sweep)
                for label in labels]
    base = next(v for v in variants if v.label == baseline)
    if base.summary is None:
        with_runs = [v.label for v in variants if v.summary is not None]
        raise UserInputError(f"the baseline {baseline!r} has no FINISHED final run that logged {metric}; pass "
                             f"another --baseline: {', '.join(with_runs)}")
    if bounded:
        variants = [replace(v, collapsed=collapsed_seeds(v.values, base.values, mode)) for v in variants]
    variants = [_with_relative_throughput(v, base) for v in variants]
    others = family_tests or {}
    comparisons, family = compare_to_baseline(variants, base, confidence, mode, equivalence, others, sweep)
    comparisons = [replace(c, two_way=two_way(sweep, c, base.label, confidence)) for c in comparisons]
    # A sequential sweep is decided by its looks, not by a test over the seeds each comparison ended with.
    comparisons, looks, look_notes = sequential_verdicts(sweep.protocol, list(sweep.looks), comparisons, mode,
                                                         baseline, metric)
    half_widths = [c.paired.summary.half_width for c in comparisons
                   if c.paired.summary is not None and c.paired.summary.half_width]
    return Analysis(
        sweep=sweep, metric=metric, mode=mode, mode_source=mode_source, confidence=confidence, baseline=baseline,
        variants=variants, comparisons=comparisons, target=base.summary.mean,
        targets=[steps_to_target(v, base, mode, confidence) for v in variants if v.summary],
        baseline_std=base.summary.std, median_half_width=float(np.median(half_widths)) if half_widths else None,
        depth=depth_profile(sweep, finished), without_metric=int((sweep.runs["outcome"] ==
                                                                   protocol.FINISHED_OUTCOME).sum()) - len(finished),
        family=family, bounded=bounded, equivalence_margin=equivalence[0] if equivalence else None,
        curve_metric=along, sequential=looks, sequential_notes=tuple(look_notes),
        examples_per_run=tuple(sorted({len(v) for v in (sweep.examples or {}).values()})))


def curve_metric(spec: dict, metric: str, history: dict[str, pd.DataFrame]) -> str:
    """The metric the curves and steps to target read: the compared one when its runs logged it along training;
    else the sweep's tuning metric (the validation split's, in the same direction by the protocol) when they
    logged that along training. A held-out test metric is read once, at the end of each run: it has no curve,
    and its steps to target would read 1.00x for every variant that got there at all."""
    tuning = spec.get("metric")
    for name in (metric, tuning):
        points = history.get(name) if name else None
        if points is not None and not points.empty and points.groupby("run_id")["step"].nunique().median() >= 2:
            return name
    return metric


def _variant(label: str, runs: pd.DataFrame, diverged: pd.DataFrame, history: dict[str, pd.DataFrame], metric: str,
             along: str, overrides: str, confidence: float, bounded: bool, sweep: Sweep) -> VariantResult:
    ids = list(runs["run_id"])
    seeds = dict(zip(runs["run_id"], runs["seed"], strict=True))
    metric_points = _of_runs(history.get(metric), ids)
    values = {seeds[run_id]: stats.final_value(points) for run_id, points in metric_points.groupby("run_id")}
    values = dict(sorted(values.items(), key=lambda item: stats.seed_order(item[0])))
    curve_points = metric_points if along == metric else _of_runs(history.get(along), ids)
    curves = {seeds[run_id]: stats.last_values(points).sort_values("step")[["step", "value"]]
              for run_id, points in curve_points.groupby("run_id")}
    tuned = sorted({str(t) for t in pd.concat([runs["tune_value"], diverged["tune_value"]])
                    if t is not None and not pd.isna(t)})
    throughput, throughput_metric = _throughput(history, ids)
    summarize = stats.summarize_bounded if bounded else stats.summarize
    tuning = sweep.tuning if sweep.tuning is not None else pd.DataFrame(columns=["variant", "outcome"])
    tuning = tuning[tuning["variant"] == label]
    return VariantResult(
        label=label, overrides=overrides, values=values,
        summary=summarize(list(values.values()), confidence) if values else None,
        tuned=", ".join(tuned) or None, parameters=_mean_final(history.get(protocol.PARAMETERS_METRIC), ids),
        throughput=throughput, throughput_metric=throughput_metric, relative_throughput=None,
        items_per_step=_mean_final(history.get(protocol.ITEMS_PER_STEP_METRIC), ids),
        spike_count=_mean_final(history.get(SPIKE_METRIC), ids),
        curve=(stats.mean_curve(curve_points) if ids and not curve_points.empty
               else pd.DataFrame(columns=["step", "mean", "std", "n"])),
        diverged={str(s): (None if pd.isna(step) else int(step))
                  for s, step in sorted(zip(diverged["seed"], diverged["diverged_step"], strict=True),
                                        key=lambda item: stats.seed_order(item[0]))},
        tuning_diverged=(int((tuning["outcome"] == protocol.DIVERGED_OUTCOME).sum()), len(tuning)),
        seed_curves=curves)


def collapsed_seeds(values: dict[str, float], baseline: dict[str, float], mode: str) -> tuple[str, ...]:
    """Seeds of a bounded metric that collapsed: closer to the worst possible value (0 for an accuracy, 1 for an
    error rate) than ``COLLAPSE_FRACTION`` of the baseline's median seed. Such a seed is an outcome of its own (a
    run that stopped learning), shown as such; its value stays in the tests, where it belongs."""
    if not baseline:
        return ()
    worst = 0.0 if mode == "max" else 1.0
    room = abs(float(np.median(list(baseline.values()))) - worst)
    return tuple(s for s, v in values.items() if abs(v - worst) < COLLAPSE_FRACTION * room)


def _of_runs(points: pd.DataFrame | None, run_ids: list[str]) -> pd.DataFrame:
    if points is None:
        return pd.DataFrame(columns=["run_id", "key", "step", "timestamp", "value"])
    return points[points["run_id"].isin(run_ids)]


def _mean_final(points: pd.DataFrame | None, run_ids: list[str]) -> float | None:
    """The mean over runs of each run's last value (None when none of them logged it)."""
    finals = [stats.final_value(p) for _, p in _of_runs(points, run_ids).groupby("run_id")]
    return float(np.mean(finals)) if finals else None


def _throughput(history: dict[str, pd.DataFrame], run_ids: list[str]) -> tuple[float | None, str | None]:
    """Items/s as the median over each run's history (robust to the slow compiled first steps and to
    validation pauses), then the mean over seeds. The protocol's names first, in its order of preference."""
    keys = [k for k in protocol.THROUGHPUT_METRICS if k in history]
    keys += sorted(k for k in history if is_throughput_metric(k) and k not in keys)
    for key in keys:
        medians = [float(p["value"].median()) for _, p in _of_runs(history[key], run_ids).groupby("run_id")]
        if medians:
            return float(np.mean(medians)), key
    return None, None


def _with_relative_throughput(variant: VariantResult, base: VariantResult) -> VariantResult:
    # Relative only within one unit: tokens/s against images/s would be a meaningless ratio.
    comparable = (variant.throughput is not None and base.throughput and
                  variant.throughput_metric == base.throughput_metric)
    relative = variant.throughput / base.throughput if comparable else None
    return replace(variant, relative_throughput=relative)


def paired_outcomes(variant: VariantResult, base: VariantResult, mode: str) -> dict[str, float]:
    """Variant - baseline for every seed both have a run of, by seed: a diverged run is the worst outcome, an
    infinite difference against its side (both diverged: no difference)."""
    worse = math.inf if mode == "min" else -math.inf
    seeds = (set(variant.values) | set(variant.diverged)) & (set(base.values) | set(base.diverged))
    outcomes = {}
    for seed in sorted(seeds, key=stats.seed_order):
        if seed in variant.diverged and seed in base.diverged:
            outcomes[seed] = 0.0
        elif seed in variant.diverged:
            outcomes[seed] = worse
        elif seed in base.diverged:
            outcomes[seed] = -worse
        else:
            outcomes[seed] = variant.values[seed] - base.values[seed]
    return outcomes


def compare_to_baseline(variants: list[VariantResult], base: VariantResult, confidence: float, mode: str,
                        equivalence: tuple[float, list[str]] | None, others: dict[str, tuple[list[float],
                                                                                              list[float]]],
                        sweep: Sweep) -> tuple[list[Comparison], Family]:
    """Every other variant against the baseline. The verdict rests on the paired t-test when every paired seed
    finished on both sides and the differences spread; otherwise on the exact sign-flip test, which counts a
    diverged seed as the worst outcome. Holm (the verdicts) and BH (screening) run over the family: this sweep's
    tests and those of the other sweeps in ``others``."""
    alpha = 1 - confidence
    margin, parity = (equivalence[0], set(equivalence[1])) if equivalence else (None, set())
    rows = []
    for v in variants:
        if v.label == base.label or (v.summary is None and not v.diverged and not v.diverged_at_every_tuning_value):
            continue
        pair = stats.paired_difference(v.values, base.values, confidence)
        outcomes = paired_outcomes(v, base, mode)
        excluded = tuple(s for s, d in outcomes.items() if math.isinf(d) or (s in v.diverged and s in base.diverged))
        p_flip = stats.sign_flip_p(list(outcomes.values())) if len(outcomes) >= 2 else None
        if pair.p_value is not None and not excluded:
            test, p = T_TEST, pair.p_value
        elif p_flip is not None:
            test, p = SIGN_FLIP, p_flip
        else:
            test, p = None, None
        rows.append((v, pair, outcomes, excluded, p_flip, test, p))
    tested = [row[6] for row in rows if row[6] is not None]
    outside = [p for ps, _ in others.values() for p in ps]
    family_p = tested + outside
    adjusted = stats.holm(family_p)[:len(tested)]
    levels = stats.holm_levels(family_p, alpha)[:len(tested)]
    q_values = stats.benjamini_hochberg(family_p)[:len(tested)]
    m = len(family_p)
    equivalence_p = {v.label: _tost(pair, excluded, margin) for v, pair, _, excluded, *_ in rows
                     if v.label in parity}
    shown = [label for label, p in equivalence_p.items() if p is not None]
    equivalence_family = [equivalence_p[label] for label in shown] + [p for _, ps in others.values() for p in ps]
    equivalence_adjusted = dict(zip(shown, stats.holm(equivalence_family), strict=False))
    index = 0
    comparisons = []
    for v, pair, outcomes, excluded, p_flip, test, p in rows:
        mde = detectable_effect(pair, alpha / max(1, m))
        common = dict(outcomes=outcomes, excluded=excluded, p_sign_flip=p_flip, test=test, mde=mde,
                      correlation=stats.seed_correlation(v.values, base.values, pair.seeds))
        if p is None:
            reason = (ALL_TUNING_DIVERGED if v.diverged_at_every_tuning_value and not outcomes
                      else NO_COMMON_SEED if not outcomes else NEEDS_PAIRS)
            comparisons.append(Comparison(v.label, pair, None, reason, **common))
            continue
        p_adjusted, level, q = adjusted[index], levels[index], q_values[index]
        index += 1
        if test == T_TEST:
            s = pair.summary
            interval = stats.t_interval(s.mean, s.std / math.sqrt(s.n), s.n - 1, 1 - level)
            direction = s.mean
        else:
            interval, direction = None, stats.signed_rank_sum(list(outcomes.values()))
        verdict = stats.verdict(direction, p_adjusted, alpha, mode)
        parity_result = None
        if v.label in parity:
            p_equivalent, p_equivalent_adjusted = equivalence_p[v.label], equivalence_adjusted.get(v.label)
            parity_result = Equivalence(margin, p_equivalent, p_equivalent_adjusted,
                                        parity_verdict(verdict, p_equivalent_adjusted, alpha, margin))
            verdict = parity_result.verdict
        comparisons.append(Comparison(v.label, pair, p_adjusted, verdict, q_value=q, level=level, interval=interval,
                                      equivalence=parity_result, **common))
    name, declared = family_name(sweep.protocol, sweep.sweep_id)
    return comparisons, Family(name, (sweep.sweep_id, *others), m, declared)


def two_way(sweep: Sweep, c: Comparison, baseline: str, confidence: float) -> tuple[float, float] | None:
    """The interval over seeds x test examples of a comparison's mean difference, at its own (Holm) level; None
    unless every finished paired seed of both sides logged its per-example results, of one length."""
    if not sweep.examples:
        return None
    runs = sweep.runs[sweep.runs["outcome"] == protocol.FINISHED_OUTCOME]
    ids = {(r.variant, str(r.seed)): r.run_id for r in runs.itertuples()}
    rows = []
    for seed in c.paired.seeds:
        mine, theirs = (sweep.examples.get(ids.get((label, seed), "")) for label in (c.label, baseline))
        if mine is None or theirs is None or len(mine) != len(theirs):
            return None
        rows.append(np.asarray(mine) - np.asarray(theirs))
    if len({len(r) for r in rows}) != 1:
        return None
    return examples.two_way_interval(np.stack(rows), 1 - c.level if c.level is not None else confidence)


def detectable_effect(pair: stats.Paired, alpha: float) -> float | None:
    """The comparison's MDE at ``alpha`` (``stats.detectable_effect``: from the upper confidence limit of its
    paired sd, the estimate the calibration checks); None below 2 pairs or without a spread."""
    if len(pair.differences) < 2:
        return None
    mde = float(stats.detectable_effect(np.asarray(pair.differences)[None, :], alpha)[0])
    return None if math.isnan(mde) else mde


def _tost(pair: stats.Paired, excluded: tuple[str, ...], margin: float | None) -> float | None:
    """The equivalence p of a parity claim; None when it cannot be shown: a diverged seed is not parity, and
    fewer than 2 pairs or zero spread leave no noise estimate."""
    if margin is None or excluded or len(pair.seeds) < 2 or pair.zero_spread:
        return None
    p = float(stats.tost_p(np.asarray(pair.differences)[None, :], margin)[0])
    return None if math.isnan(p) else p


def parity_verdict(difference_verdict: str, p_equivalent: float | None, alpha: float, margin: float) -> str:
    """A parity claim in its own terms: equivalence shown (the two one-sided tests, Holm over the family's parity
    claims), a difference shown (the Holm-adjusted difference test), or neither."""
    if p_equivalent is not None and p_equivalent < alpha:
        return EQUIVALENT.format(margin=margin)
    if difference_verdict in (stats.BETTER, stats.WORSE):
        return f"{DIFFERENT} ({difference_verdict})"
    return NOT_EQUIVALENT


def tested_p_values(analysis: Analysis) -> tuple[list[float], list[float]]:
    """This sweep's contribution to its family: the p of each tested comparison, and each parity claim's
    equivalence p (what another sweep of the family takes in as ``family_tests``)."""
    differences, equivalences = [], []
    for c in analysis.comparisons:
        if c.p_adjusted is None:
            continue
        differences.append(c.p_sign_flip if c.test == SIGN_FLIP else c.paired.p_value)
        if c.equivalence is not None and c.equivalence.p_value is not None:
            equivalences.append(c.equivalence.p_value)
    return differences, equivalences


def untestable(analysis: Analysis) -> list[str]:
    """The variants no test against the baseline could be run for (fewer than 2 paired seeds)."""
    return [c.label for c in analysis.comparisons if c.p_adjusted is None]


def steps_to_target(variant: VariantResult, base: VariantResult, mode: str, confidence: float) -> Speedup:
    """Per seed both finished, on the curve metric: the target is the baseline seed's own final value of it (its
    last logged point); each run's "reached" step is the first crossing of its raw curve, interpolated between
    logged points (``stats.step_reaching``; no best-so-far smoothing); the ratio is the baseline seed's step /
    the variant's. The baseline against itself is 1.00 at every seed by construction. A variant seed that never
    reached the target is censored at its last logged step: its ratio is at most the baseline step / that step.
    The summary is the median over all seeds with a distribution-free interval and a sign test
    (``stats.censored_median``); a mean over the reached seeds alone would keep only the seeds that did well."""
    seeds = sorted(set(variant.seed_curves) & set(base.seed_curves), key=stats.seed_order)
    steps, ratios, bounds, step_or_last = {}, {}, {}, []
    for seed in seeds:
        base_curve, curve = base.seed_curves[seed], variant.seed_curves[seed]
        target = float(base_curve["value"].iloc[-1])
        base_step = stats.step_reaching(list(base_curve["step"]), list(base_curve["value"]), target, mode)
        step = stats.step_reaching(list(curve["step"]), list(curve["value"]), target, mode)
        steps[seed] = step
        last = float(curve["step"].iloc[-1]) if len(curve) else None
        step_or_last.append((step, False) if step is not None else (last, True))
        if base_step is None or not base_step > 0:
            continue
        if step is not None and step > 0:
            ratios[seed] = base_step / step
        elif step is None and last:
            bounds[seed] = base_step / last
    summary = stats.censored_median(list(ratios.values()), list(bounds.values()), confidence)
    tokens, bounded = None, False
    known = sorted((s, c) for s, c in step_or_last if s is not None)
    if known and variant.items_per_step is not None:
        tokens = float(np.median([s for s, _ in known])) * variant.items_per_step
        # A not-reached step is a lower bound: one at or below the median's position could lie above it.
        bounded = any(c for _, c in known[:len(known) // 2 + 1])
    return Speedup(variant.label, len(seeds), steps, ratios, bounds, summary, tokens, bounded)


def sublayer_order(name: str) -> tuple[int, int, int]:
    """Where a sublayer (a name ``SUBLAYER`` matches) sits along the residual stream."""
    if name == "embedding":
        return 0, 0, 0
    if name == "final":
        return 2, 0, 0
    match = SUBLAYER.match(name)
    return 1, int(match["block"]), 0 if match["part"] == "attn" else 1


def depth_profile(sweep: Sweep, runs: pd.DataFrame, prefix: str = STREAM_RMS_PREFIX) -> DepthProfile | None:
    """Per variant, the stream RMS (or another ``<prefix><sublayer>`` metric) after each sublayer at the first and
    at the last step each run logged it, mean over seeds; None when no run logged such a metric."""
    points = sweep.history[sweep.history["key"].str.startswith(prefix)
                           & sweep.history["run_id"].isin(set(runs["run_id"]))]
    points = points.assign(sublayer=points["key"].str.slice(len(prefix)))
    points = points[points["sublayer"].map(lambda s: SUBLAYER.match(s) is not None)]
    if points.empty:
        return None
    ordered = points.sort_values(["run_id", "sublayer", "step", "timestamp"], kind="stable")
    by_series = ordered.drop_duplicates(["run_id", "sublayer", "step"], keep="last").groupby(["run_id", "sublayer"])
    ends = {"first": by_series.head(1), "last": by_series.tail(1)}
    variant_of = dict(zip(runs["run_id"], runs["variant"], strict=True))
    profiles: dict[str, dict[str, pd.Series]] = {"first": {}, "last": {}}
    for end, rows in ends.items():
        rows = rows.assign(variant=rows["run_id"].map(variant_of))
        for label in variant_labels(sweep):  # the report's order, so that legends read alike
            group = rows[rows["variant"] == label]
            if not group.empty:
                means = group.groupby("sublayer")["value"].mean()
                profiles[end][label] = means.loc[sorted(means.index, key=sublayer_order)]
    return DepthProfile(first=profiles["first"], last=profiles["last"],
                        first_steps=tuple(sorted(set(ends["first"]["step"].astype(float)))),
                        last_steps=tuple(sorted(set(ends["last"]["step"].astype(float)))))


def describe_overrides(overrides: object) -> str:
    """A variant's overrides as one line, whichever shape the protocol stored them in."""
    if overrides is None:
        return ""
    if isinstance(overrides, dict):
        return " ".join(f"{k}={v}" for k, v in overrides.items())
    if isinstance(overrides, (list, tuple)):
        return " ".join(str(o) for o in overrides)
    return str(overrides)
