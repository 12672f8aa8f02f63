"""The report's figures as PNG files: validation curves, a forest plot, and the depth profile.

Figures are built with ``matplotlib.figure.Figure`` (rendered by Agg) rather than pyplot: no global figure
state and no GUI backend, so ``compare`` draws the same way on a headless node, in a notebook or in tests.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from lit.compare.analysis import Analysis, DepthProfile

CURVES, FOREST, DEPTH = "curves.png", "forest.png", "depth.png"
DPI = 120
EARLY_FRACTION = 0.25  # of the steps: the part of a curve left out of the y range (see visible_range)
MARGIN = 0.08  # of the visible range, above and below
LOG_RANGE = 10.0  # a depth profile spanning more than this factor is drawn on a log axis


def draw_all(analysis: Analysis, out: Path) -> list[str]:
    """Every figure the data allows, written into ``out``; returns their file names."""
    written = [draw_curves(analysis, out / CURVES), draw_forest(analysis, out / FOREST)]
    if analysis.depth is not None:
        written.append(draw_depth(analysis.depth, analysis.baseline, out / DEPTH))
    return [path.name for path in written]


def visible_range(curves: list[pd.DataFrame]) -> tuple[float, float] | None:
    """The y range in which the curves can be told apart. The first validation points sit far from the rest
    (a loss of 10 against 3.3): a range that includes them squeezes every difference worth seeing into a few
    pixels. So the first quarter of each curve's steps is left out (all but its first point when that leaves
    fewer than two), with the ±std band included."""
    lows, highs = [], []
    for curve in curves:
        if curve.empty:
            continue
        steps = curve["step"].to_numpy()
        late = steps >= steps[0] + EARLY_FRACTION * (steps[-1] - steps[0])
        if late.sum() < 2:
            late = np.arange(len(steps)) >= min(1, len(steps) - 1)
        mean, std = curve["mean"].to_numpy()[late], np.nan_to_num(curve["std"].to_numpy()[late])
        lows.append(np.min(mean - std))
        highs.append(np.max(mean + std))
    if not lows:
        return None
    low, high = float(min(lows)), float(max(highs))
    pad = MARGIN * (high - low) if high > low else max(abs(high), 1.0) * 0.01
    return low - pad, high + pad


def draw_curves(analysis: Analysis, path: Path) -> Path:
    """The metric against steps per variant: mean over seeds with a ±std band, and the baseline's final mean."""
    fig = Figure(figsize=(7.5, 4.5), layout="constrained")
    ax = fig.add_subplot()
    shown = [v for v in analysis.variants if not v.curve.empty]
    for variant in shown:
        curve = variant.curve
        line, = ax.plot(curve["step"], curve["mean"], marker="o", markersize=3,
                        label=f"{variant.label} (n={int(curve['n'].iloc[0])})")
        if curve["std"].notna().any():
            ax.fill_between(curve["step"], curve["mean"] - curve["std"], curve["mean"] + curve["std"],
                            color=line.get_color(), alpha=0.18, linewidth=0)
    ax.axhline(analysis.target, color="0.35", linestyle=":", linewidth=1,
               label=f"baseline final mean ({analysis.baseline})")
    limits = visible_range([v.curve for v in shown])
    if limits is not None:
        ax.set_ylim(*limits)
    better = "lower" if analysis.mode == "min" else "higher"
    ax.set(xlabel="step", ylabel=analysis.metric,
           title=f"{analysis.metric} (mean ± std over seeds; {better} is better; early steps off the axis)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.savefig(path, dpi=DPI)
    return path


def draw_forest(analysis: Analysis, path: Path) -> Path:
    """Left: each variant's final metric with its t interval and the seeds as dots, against the baseline's
    mean. Right: the paired differences to the baseline with their intervals, against zero."""
    fig = Figure(figsize=(10, 0.6 * len(analysis.variants) + 1.8), layout="constrained")
    left, right = fig.subplots(1, 2, sharey=True)
    labels = [v.label for v in analysis.variants]
    rows = {label: len(labels) - 1 - i for i, label in enumerate(labels)}  # the first variant on top
    confidence = f"{analysis.confidence:.0%}"
    for variant in analysis.variants:
        if variant.summary is None:
            continue
        y = rows[variant.label]
        left.scatter(list(variant.values.values()), [y] * len(variant.values), s=12, color="0.6", zorder=2)
        _interval(left, y, variant.summary.mean, variant.summary.interval)
    left.axvline(analysis.target, color="0.35", linestyle=":", linewidth=1)
    left.set(xlabel=f"final {analysis.metric} (mean, {confidence} CI, seeds)", title="per variant")
    for comparison in analysis.comparisons:
        summary = comparison.paired.summary
        if summary is None:
            continue
        y = rows[comparison.label]
        right.scatter(comparison.paired.differences, [y] * len(comparison.paired.differences), s=12,
                      color="0.6", zorder=2)
        _interval(right, y, summary.mean, summary.interval)
    right.axvline(0, color="0.35", linestyle=":", linewidth=1)
    direction = "← better" if analysis.mode == "min" else "better →"
    right.set(xlabel=f"variant − {analysis.baseline} (mean, {confidence} CI, per seed)",
              title=f"paired difference ({direction})")
    left.set_yticks(list(rows.values()), list(rows.keys()))
    for ax in (left, right):
        ax.grid(alpha=0.3, axis="x")
        ax.set_ylim(-0.7, len(labels) - 0.3)
    fig.savefig(path, dpi=DPI)
    return path


def _interval(ax, y: float, mean: float, interval: tuple[float, float] | None) -> None:
    # No bar for a single seed: an interval of width zero would read as certainty.
    error = None if interval is None else [[mean - interval[0]], [interval[1] - mean]]
    ax.errorbar([mean], [y], xerr=error, fmt="o", color="C0", capsize=4, zorder=3)


def draw_depth(depth: DepthProfile, baseline: str, path: Path) -> Path:
    """Stream RMS against sublayer index per variant (mean over seeds), at the first and the last logged step."""
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    panels = fig.subplots(1, 2, sharey=True)
    everything = [s for profiles in (depth.first, depth.last) for s in profiles.values()]
    values = np.concatenate([s.to_numpy() for s in everything])
    logarithmic = values.min() > 0 and values.max() / values.min() > LOG_RANGE
    longest = max(everything, key=len)
    for ax, profiles, steps, when in ((panels[0], depth.first, depth.first_steps, "first"),
                                      (panels[1], depth.last, depth.last_steps, "last")):
        for label, series in profiles.items():
            ax.plot(range(len(series)), series.to_numpy(), marker="o", markersize=3,
                    linewidth=2 if label == baseline else 1.2, label=label)
        at = f"step {steps[0]:g}" if len(steps) == 1 else f"steps {steps[0]:g}–{steps[-1]:g}"
        ax.set(title=f"{when} logged step ({at})", xlabel="sublayer (residual stream order)")
        ticks = list(range(len(longest)))
        every = max(1, len(ticks) // 16)  # keep the labels legible for deep models
        ax.set_xticks(ticks[::every], [short_sublayer(n) for n in longest.index][::every], rotation=60,
                      fontsize="small")
        ax.grid(alpha=0.3)
        if logarithmic:
            ax.set_yscale("log")
    panels[0].set_ylabel("stream RMS" + (" (log scale)" if logarithmic else ""))
    panels[1].legend(fontsize="small")
    fig.savefig(path, dpi=DPI)
    return path


def short_sublayer(name: str) -> str:
    """``layer03.attn`` -> ``3.attn``, ``embedding`` -> ``emb``: tick labels that fit under a dense axis."""
    if name.startswith("layer"):
        block, part = name[len("layer"):].split(".")
        return f"{int(block)}.{part}"
    return {"embedding": "emb"}.get(name, name)
