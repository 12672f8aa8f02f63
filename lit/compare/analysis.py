"""A sweep turned into the numbers of its report: per-variant summaries, paired tests against the baseline,
steps to the baseline's final value, throughput, and the depth profile when the runs logged one.

Everything here is a pure function of a ``Sweep`` (no MLflow, no files), so the report and the plots show
the same numbers and the tests can check them against a computation by hand.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from lit.compare import stats
from lit.compare.runs import SPIKE_METRIC, STREAM_RMS_PREFIX, Sweep, is_throughput_metric
from lit.errors import UserInputError
from lit.sweep import protocol

NEEDS_SEEDS = "needs ≥2 seeds for an interval"
NEEDS_PAIRS = "needs ≥2 paired seeds for a test"
NO_COMMON_SEED = "no seed in common with the baseline"
# Sublayers in the order the residual stream passes them: embedding, then each block's attention and MLP.
SUBLAYER = re.compile(r"^(?:embedding|layer(?P<block>\d{2})\.(?P<part>attn|mlp)|final)$")


@dataclass(frozen=True)
class VariantResult:
    """One variant's counted seed runs: the final metric per seed and what else the runs logged."""

    label: str
    overrides: str
    values: dict[str, float]  # seed -> the metric at the run's last logged step
    summary: stats.Summary | None  # None when none of its runs is counted
    tuned: str | None  # the tuned value its final runs ran with (one, or several joined by ", ")
    parameters: float | None
    throughput: float | None  # items/s: median over each run's history, mean over seeds
    throughput_metric: str | None
    relative_throughput: float | None  # / the baseline's
    items_per_step: float | None
    spike_count: float | None
    curve: pd.DataFrame  # stats.mean_curve of the metric: step, mean, std, n


@dataclass(frozen=True)
class Comparison:
    """A variant against the baseline: the paired difference, its Holm-adjusted p and the verdict."""

    label: str
    paired: stats.Paired
    p_adjusted: float | None
    verdict: str


@dataclass(frozen=True)
class Target:
    """When a variant's mean curve reaches the baseline's final mean, and the speedup that gives."""

    label: str
    step: float | None  # None: never reached
    tokens: float | None  # step x items per step, when the runs logged their batch size
    speedup: float | None  # the baseline's final step / step


@dataclass(frozen=True)
class DepthProfile:
    """RMS of the residual stream after each sublayer, mean over seeds, at the first and the last logged step."""

    first: dict[str, pd.Series]  # label -> RMS indexed by sublayer name, in stream order
    last: dict[str, pd.Series]
    first_steps: tuple[float, ...]  # the distinct steps the first profiles come from (one, when runs agree)
    last_steps: tuple[float, ...]


@dataclass(frozen=True)
class Analysis:
    sweep: Sweep
    metric: str
    mode: str  # "min": lower is better; "max": higher is better
    confidence: float
    baseline: str
    variants: list[VariantResult]
    comparisons: list[Comparison]
    target: float  # the baseline's final mean
    baseline_final_step: float
    targets: list[Target]
    baseline_std: float | None
    median_half_width: float | None  # of the paired-difference intervals: the smallest detectable effect
    depth: DepthProfile | None
    without_metric: int  # counted runs that never logged the metric

    @property
    def protocol(self) -> dict:
        return self.sweep.protocol

    @property
    def alpha(self) -> float:
        return 1 - self.confidence


def metric_direction(spec: dict, metric: str) -> str:
    """"min" or "max": the protocol's own mode for its metric (the sweep tuned by it), else by the name."""
    if metric == spec.get("metric") and spec.get("mode") in stats.MODES:
        return spec["mode"]
    return protocol.metric_mode(metric)


def variant_labels(sweep: Sweep) -> list[str]:
    """The protocol's variants in its order, then any label only the runs carry (a hand-added run)."""
    labels = [v["label"] for v in sweep.protocol.get("variants", [])]
    return labels + sorted(set(sweep.runs["variant"]) - set(labels))


def analyze(sweep: Sweep, metric: str, baseline: str | None, confidence: float) -> Analysis:
    """All the numbers of the report. ``baseline`` None means the protocol's baseline."""
    labels = variant_labels(sweep)
    baseline = baseline or sweep.protocol.get("baseline") or labels[0]
    if baseline not in labels:
        raise UserInputError(f"{baseline!r} is not a variant of sweep {sweep.sweep_id}; pass one of its labels to "
                             f"--baseline: {', '.join(labels)}")
    mode = metric_direction(sweep.protocol, metric)
    history = {key: points for key, points in sweep.history.groupby("key")}
    metric_points = history.get(metric, sweep.history.iloc[0:0])
    runs = sweep.runs[sweep.runs["run_id"].isin(set(metric_points["run_id"]))]
    overrides = {v["label"]: describe_overrides(v.get("overrides")) for v in sweep.protocol.get("variants", [])}
    variants = [_variant(label, runs[runs["variant"] == label], history, metric, overrides.get(label, ""),
                         confidence) for label in labels]
    base = next(v for v in variants if v.label == baseline)
    if base.summary is None:
        with_runs = [v.label for v in variants if v.summary is not None]
        raise UserInputError(f"the baseline {baseline!r} has no FINISHED final run that logged {metric}; pass "
                             f"another --baseline: {', '.join(with_runs)}")
    variants = [_with_relative_throughput(v, base) for v in variants]
    comparisons = compare_to_baseline(variants, base, confidence, mode)
    half_widths = [c.paired.summary.half_width for c in comparisons
                   if c.paired.summary is not None and c.paired.summary.half_width is not None]
    final_step = float(base.curve["step"].iloc[-1]) if len(base.curve) else math.nan
    return Analysis(
        sweep=sweep, metric=metric, mode=mode, confidence=confidence, baseline=baseline, variants=variants,
        comparisons=comparisons, target=base.summary.mean, baseline_final_step=final_step,
        targets=[steps_to_target(v, base.summary.mean, final_step, mode) for v in variants if v.summary],
        baseline_std=base.summary.std, median_half_width=float(np.median(half_widths)) if half_widths else None,
        depth=depth_profile(sweep, runs), without_metric=len(sweep.runs) - len(runs))


def _variant(label: str, runs: pd.DataFrame, history: dict[str, pd.DataFrame], metric: str, overrides: str,
             confidence: float) -> VariantResult:
    ids = list(runs["run_id"])
    seeds = dict(zip(runs["run_id"], runs["seed"], strict=True))
    metric_points = _of_runs(history.get(metric), ids)
    values = {seeds[run_id]: stats.final_value(points) for run_id, points in metric_points.groupby("run_id")}
    values = dict(sorted(values.items(), key=lambda item: stats.seed_order(item[0])))
    tuned = sorted({str(t) for t in runs["tune_value"] if t is not None and not pd.isna(t)})
    throughput, throughput_metric = _throughput(history, ids)
    return VariantResult(
        label=label, overrides=overrides, values=values,
        summary=stats.summarize(list(values.values()), confidence) if values else None,
        tuned=", ".join(tuned) or None, parameters=_mean_final(history.get(protocol.PARAMETERS_METRIC), ids),
        throughput=throughput, throughput_metric=throughput_metric, relative_throughput=None,
        items_per_step=_mean_final(history.get(protocol.ITEMS_PER_STEP_METRIC), ids),
        spike_count=_mean_final(history.get(SPIKE_METRIC), ids),
        curve=stats.mean_curve(metric_points) if ids else pd.DataFrame(columns=["step", "mean", "std", "n"]))


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


def compare_to_baseline(variants: list[VariantResult], base: VariantResult, confidence: float,
                        mode: str) -> list[Comparison]:
    """Paired t-tests of every other variant against the baseline, Holm-adjusted over those that have a p."""
    paired = [(v.label, stats.paired_difference(v.values, base.values, confidence))
              for v in variants if v.label != base.label and v.summary is not None]
    tested = [p.p_value for _, p in paired if p.p_value is not None]
    adjusted = iter(stats.holm(tested))
    comparisons = []
    for label, pair in paired:
        if pair.p_value is None:
            reason = NO_COMMON_SEED if not pair.seeds else NEEDS_PAIRS
            comparisons.append(Comparison(label, pair, None, reason))
            continue
        p_adjusted = next(adjusted)
        comparisons.append(Comparison(label, pair, p_adjusted,
                                      stats.verdict(pair.summary.mean, p_adjusted, 1 - confidence, mode)))
    return comparisons


def untestable(analysis: Analysis) -> list[str]:
    """The variants no test against the baseline could be run for (fewer than 2 paired seeds)."""
    return [c.label for c in analysis.comparisons if c.p_adjusted is None]


def steps_to_target(variant: VariantResult, target: float, baseline_final_step: float, mode: str) -> Target:
    """The step at which the variant's mean curve first reaches ``target``. The tolerance lets the baseline's
    own curve, which ends at its final mean, count as reaching it despite a different summation order."""
    tolerance = 1e-9 * max(1.0, abs(target))
    nudged = target + tolerance if mode == "min" else target - tolerance
    step = stats.step_reaching(list(variant.curve["step"]), list(variant.curve["mean"]), nudged, mode)
    if step is None:
        return Target(variant.label, None, None, None)
    tokens = step * variant.items_per_step if variant.items_per_step is not None else None
    speedup = baseline_final_step / step if step > 0 else None
    return Target(variant.label, step, tokens, speedup)


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
