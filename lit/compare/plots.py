"""The report's figures as PNG files: validation curves, a forest plot, and the depth profile.

Figures are built with ``matplotlib.figure.Figure`` (rendered by Agg) rather than pyplot: no global figure
state and no GUI backend, so ``compare`` draws the same way on a headless node, in a notebook or in tests.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.colors
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from lit.compare.analysis import Analysis, DepthProfile
from lit.compare.depth_quantities import LABELS, depth_quantities

CURVES, FOREST, DEPTH = "curves.png", "forest.png", "depth.png"
DEPTH_QUANTITIES = "depth_quantities.png"
DPI = 120
LATE_FRACTION = 0.25  # of the steps: the zoomed panel of the curves
MARGIN = 0.08  # of the visible range, above and below
LEGEND_INSIDE = 8  # variants: more and the curves' legend goes beside the panel
LOG_RANGE = 10.0  # a depth profile spanning more than this factor is drawn on a log axis


def draw_all(analysis: Analysis, out: Path) -> list[str]:
    """Every figure the data allows, written into ``out``; returns their file names."""
    written = [draw_curves(analysis, out / CURVES), draw_forest(analysis, out / FOREST)]
    if analysis.depth is not None:
        written.append(draw_depth(analysis.depth, analysis.baseline, variant_colors(analysis), out / DEPTH))
    quantities = depth_quantities(analysis.sweep)
    if quantities:
        written.append(draw_depth_quantities(quantities, analysis.baseline, variant_colors(analysis),
                                             out / DEPTH_QUANTITIES))
    return [path.name for path in written]


def visible_range(curves: list[pd.DataFrame], since: float | None = None) -> tuple[float, float] | None:
    """The y range of the curves' mean ± std from step ``since`` on (from their second point when None).
    The first validation point sits far from the rest (a loss of 10 against 3.3): a range that includes it
    squeezes every difference worth seeing into a few pixels."""
    lows, highs = [], []
    for curve in curves:
        steps = curve["step"].to_numpy()
        if len(steps) == 0:
            continue
        shown = steps >= since if since is not None else np.arange(len(steps)) >= min(1, len(steps) - 1)
        mean, std = curve["mean"].to_numpy()[shown], np.nan_to_num(curve["std"].to_numpy()[shown])
        if len(mean):
            lows.append(np.min(mean - std))
            highs.append(np.max(mean + std))
    if not lows:
        return None
    low, high = float(min(lows)), float(max(highs))
    pad = MARGIN * (high - low) if high > low else max(abs(high), 1.0) * 0.01
    return low - pad, high + pad


def worst_start(variants: list, mode: str) -> float | None:
    """The worst first point of the variants' curves: where the slowest-starting run began."""
    firsts = [float(v.curve["mean"].iloc[0]) for v in variants if len(v.curve)]
    return None if not firsts else max(firsts) if mode == "min" else min(firsts)


def within_start(limits: tuple[float, float], variants: list, mode: str) -> tuple[float, float]:
    """The whole-run panel's range, cut at the worst first point: a curve that later goes worse than where
    every run started (a loss spike, an eval-mode blow-up) leaves the axis there instead of flattening the
    others into a line. The cut curves are named in the title (``beyond_start``)."""
    worst = worst_start(variants, mode)
    if worst is None:
        return limits
    low, high = limits
    if mode == "min":
        return low, min(high, worst + MARGIN * abs(worst - low))
    return max(low, worst - MARGIN * abs(high - worst)), high


def beyond_start(variants: list, mode: str) -> list[str]:
    """The variants whose curve (mean ± std aside) goes worse than the worst first point."""
    worst = worst_start(variants, mode)
    if worst is None:
        return []
    return [v.label for v in variants if len(v.curve) and
            (v.curve["mean"].max() > worst if mode == "min" else v.curve["mean"].min() < worst)]


def typical(variants: list, spread: float = 8.0) -> list:
    """The variants whose final mean is within ``spread`` robust standard deviations (1.4826 MAD) of the
    median final mean: the zoomed panel fits these, so one diverged variant (a loss 0.6 above everyone)
    does not squeeze differences of 0.01 into a pixel. Fewer than 4 variants: all of them."""
    if len(variants) < 4:
        return variants
    finals = np.array([float(v.curve["mean"].iloc[-1]) for v in variants])
    median = float(np.median(finals))
    mad = 1.4826 * float(np.median(np.abs(finals - median)))
    if mad == 0:
        return variants
    return [v for v, f in zip(variants, finals, strict=True) if abs(f - median) <= spread * mad]


def late_window(curves: list[pd.DataFrame]) -> float | None:
    """The first step of the zoomed panel: the last quarter of training, or the last two validation points of
    every curve if the quarter holds fewer (a zoom on one point shows no trend)."""
    steps = sorted({float(s) for c in curves for s in c["step"]})
    if len(steps) < 3:
        return None
    start = steps[0] + (1 - LATE_FRACTION) * (steps[-1] - steps[0])
    return min([start] + [float(c["step"].iloc[-2]) for c in curves if len(c) >= 2])


def draw_curves(analysis: Analysis, path: Path) -> Path:
    """The metric against steps per variant: mean over seeds with a ±std band, and the baseline's final mean.
    Left the whole run (from the second validation point up), right the last quarter, where the variants
    separate: a y axis fit to the whole run would hide differences of the size the report tests."""
    shown = [v for v in analysis.variants if not v.curve.empty]
    since = late_window([v.curve for v in shown])
    in_view = typical(shown)  # what the zoomed panel's axis fits
    height = max(4.5, 0.2 * len(shown) + 1.0) if len(shown) > LEGEND_INSIDE else 4.5  # room for the legend
    fig = Figure(figsize=(14, height) if since is not None else (9.5, height), layout="constrained")
    panels = fig.subplots(1, 2) if since is not None else [fig.add_subplot()]
    colors = variant_colors(analysis)
    cut = beyond_start(shown, analysis.mode)  # the whole-run panel fits the others, cut at the worst start
    base = next((v for v in shown if v.label == analysis.baseline), None)  # its final mean: a dotted line
    for ax, start in zip(panels, (None, since), strict=False):
        for variant in shown:
            curve = variant.curve if start is None else variant.curve[variant.curve["step"] >= start]
            ax.plot(curve["step"], curve["mean"], marker="o", markersize=3, color=colors[variant.label],
                    linewidth=2 if variant.label == analysis.baseline else 1.3,
                    label=f"{variant.label} (n={int(variant.curve['n'].iloc[0])})")
            if curve["std"].notna().any():
                ax.fill_between(curve["step"], curve["mean"] - curve["std"], curve["mean"] + curve["std"],
                                color=colors[variant.label], alpha=0.18, linewidth=0)
        if base is not None:
            ax.axhline(float(base.curve["mean"].iloc[-1]), color="0.35", linestyle=":", linewidth=1,
                       label=f"final mean of {analysis.baseline}")
        fitted = ([v for v in shown if v.label not in cut] or shown) if start is None else in_view
        limits = visible_range([v.curve for v in fitted], start)
        if limits is not None:
            ax.set_ylim(*(limits if start is not None else within_start(limits, shown, analysis.mode)))
        ax.set(xlabel="step", ylabel=analysis.curve_of)
        ax.grid(alpha=0.3)
    better = "lower" if analysis.mode == "min" else "higher"
    panels[0].set_title(f"{analysis.curve_of}, mean ± std over seeds ({better} is better)"
                        + (f"\ncut at the worst start: {', '.join(cut)}" if cut else ""), fontsize="medium")
    if since is not None:
        off = [v.label for v in shown if v not in in_view]
        panels[1].set_title(f"from step {since:g}" + (f"\noff the axis: {', '.join(off)}" if off else ""),
                            fontsize="medium")
    if len(shown) > LEGEND_INSIDE:  # a long legend beside the panel, not over the curves
        panels[-1].legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        panels[-1].legend(fontsize="small")
    fig.savefig(path, dpi=DPI)
    return path


def variant_colors(analysis: Analysis) -> dict[str, str]:
    """One color per variant, the same in every figure, in the report's variant order: matplotlib's cycle up to
    10 variants, then the 20 colors of tab20 (no two variants share one up to 20)."""
    if len(analysis.variants) <= 10:
        return {v.label: f"C{i}" for i, v in enumerate(analysis.variants)}
    palette = matplotlib.colormaps["tab20"].colors
    return {v.label: matplotlib.colors.to_hex(palette[i % 20]) for i, v in enumerate(analysis.variants)}


def draw_forest(analysis: Analysis, path: Path) -> Path:
    """Left: each variant's final metric with its t interval and the seeds as dots, against the baseline's
    mean. Right: the paired differences to the baseline with their intervals, against zero."""
    fig = Figure(figsize=(10, 0.6 * len(analysis.variants) + 1.8), layout="constrained")
    left, right = fig.subplots(1, 2, sharey=True)
    labels = [v.label for v in analysis.variants]
    rows = {label: len(labels) - 1 - i for i, label in enumerate(labels)}  # the first variant on top
    confidence = f"{analysis.confidence:.0%}"
    colors = variant_colors(analysis)
    for variant in analysis.variants:
        if variant.summary is None:
            continue
        y = rows[variant.label]
        left.scatter(list(variant.values.values()), [y] * len(variant.values), s=12, color="0.6", zorder=2)
        _interval(left, y, variant.summary.mean, variant.summary.interval, colors[variant.label])
    left.axvline(analysis.target, color="0.35", linestyle=":", linewidth=1)
    left.set(xlabel=f"final {analysis.metric} (mean, {confidence} CI, seeds)", title="per variant")
    for comparison in analysis.comparisons:
        summary = comparison.paired.summary
        if summary is None:
            continue
        y = rows[comparison.label]
        right.scatter(comparison.paired.differences, [y] * len(comparison.paired.differences), s=12,
                      color="0.6", zorder=2)
        _interval(right, y, summary.mean, summary.interval, colors[comparison.label])
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


def _interval(ax, y: float, mean: float, interval: tuple[float, float] | None, color: str) -> None:
    # No bar for a single seed: an interval of width zero would read as certainty.
    error = None if interval is None else [[mean - interval[0]], [interval[1] - mean]]
    ax.errorbar([mean], [y], xerr=error, fmt="o", color=color, capsize=4, zorder=3)


def draw_depth(depth: DepthProfile, baseline: str, colors: dict[str, str], path: Path) -> Path:
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
            ax.plot(range(len(series)), series.to_numpy(), marker="o", markersize=3, color=colors.get(label),
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


def draw_depth_quantities(quantities: dict[str, dict[str, pd.Series]], baseline: str, colors: dict[str, str],
                          path: Path) -> Path:
    """One panel per quantity (``depth_quantities``) against sublayer index, a line per variant (mean over seeds)
    at the last logged step."""
    columns = min(3, len(quantities))
    rows = -(-len(quantities) // columns)
    fig = Figure(figsize=(4.4 * columns, 3.6 * rows), layout="constrained")
    panels = np.atleast_1d(fig.subplots(rows, columns, squeeze=False).ravel())
    for ax, (prefix, profiles) in zip(panels, quantities.items(), strict=False):
        longest = max(profiles.values(), key=len)
        for label, series in profiles.items():
            ax.plot(range(len(series)), series.to_numpy(), marker="o", markersize=3, color=colors.get(label),
                    linewidth=2 if label == baseline else 1.2, label=label)
        ticks = list(range(len(longest)))
        every = max(1, len(ticks) // 12)
        ax.set_xticks(ticks[::every], [short_sublayer(n) for n in longest.index][::every], rotation=60,
                      fontsize="small")
        values = np.concatenate([s.to_numpy() for s in profiles.values()])
        if prefix in ("diag/kurtosis/", "diag/max_median/") and values.min() > 0 \
                and values.max() > LOG_RANGE * values.min():
            ax.set_yscale("log")
        ax.set(ylabel=LABELS[prefix], xlabel="sublayer (residual stream order)")
        ax.grid(alpha=0.3)
    for ax in panels[len(quantities):]:
        ax.set_visible(False)
    panels[0].legend(fontsize="small")
    fig.suptitle("Outliers and sublayer contribution by depth, last logged step (mean over seeds)", fontsize="medium")
    fig.savefig(path, dpi=DPI)
    return path
