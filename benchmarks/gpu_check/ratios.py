"""A paired step-time ratio: its estimate and interval over rounds, and its verdict against the plugin's target.

Each round times the variant and the baseline in adjacent windows and gives one ratio (variant median step over
baseline median step), so drift that spans a round cancels. The headline is the median of the round ratios (what
the first check reported). The interval is a t interval on the log ratios (``lit.statistics.sequential.critical_t``,
the paired t the sweep and compare use), exponentiated: a ratio is multiplicative, so its rounds are averaged on a
log scale, and the interval is for the geometric mean of the round ratios. With one round there is no spread to
judge, so the interval is unbounded.

Targets are issue 43's (item 6), from the review's arithmetic (``../shared/specs/gpu-plugins.md``, section 1): every
plugin compiled at most 1.15x the compiled baseline, except hyper-connections 1.25x, mHC 1.35x and full AttnRes
1.3x; eager at most 1.5x the eager baseline.
"""

from __future__ import annotations

import math
import statistics

from lit.statistics.sequential import critical_t

CONFIDENCE = 0.95
EAGER_TARGET = 1.5
COMPILED_TARGET = 1.15
COMPILED_TARGETS = {"residual=hyperconn": 1.25, "residual=hyperconn_static": 1.25, "residual=mhc": 1.35,
                    "residual=attnres": 1.3}


def target(label: str, compiled: bool) -> float:
    """The most this variant's step may cost, as a multiple of the baseline's step in the same mode."""
    return COMPILED_TARGETS.get(label, COMPILED_TARGET) if compiled else EAGER_TARGET


def interval(ratios: list[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The t interval of the geometric mean of ``ratios`` (one per round), on the ratio's scale."""
    if len(ratios) < 2:
        return 0.0, math.inf
    logs = [math.log(r) for r in ratios]
    half = critical_t(1 - confidence, len(logs)) * statistics.stdev(logs) / math.sqrt(len(logs))
    mean = statistics.fmean(logs)
    return math.exp(mean - half), math.exp(mean + half)


def verdict(ratio: float, ci: tuple[float, float], limit: float) -> str:
    """``met`` or ``MISSED`` by the median ratio; ``(not settled)`` when the interval straddles the target."""
    word = "met" if ratio <= limit else "MISSED"
    settled = ci[1] <= limit if ratio <= limit else ci[0] > limit
    return word if settled else f"{word} (not settled)"


def summary(label: str, compiled: bool, ratios: list[float]) -> dict:
    """The row's ratio columns: median, interval, geometric mean, target and verdict."""
    ratio = statistics.median(ratios)
    ci = interval(ratios)
    limit = target(label, compiled)
    return {"step_ratio": ratio, "ratio_ci": list(ci), "ratio_geomean": math.exp(statistics.fmean(
        math.log(r) for r in ratios)), "ratio_min": min(ratios), "ratio_max": max(ratios), "ratios": ratios,
        "rounds": len(ratios), "target": limit, "verdict": verdict(ratio, ci, limit)}
