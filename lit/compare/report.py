"""The report as Markdown: the protocol in words, then the numbers of ``Analysis``, with figures linked by
relative paths (the Markdown and its PNGs sit in one folder, locally and under the parent run's ``report/``).

Values are printed to the decimals the noise deserves: two significant digits of the sweep's spread, so a
0.002 difference between losses of 3.28 is visible and a 1e-7 one is not dressed up as a finding.
"""

from __future__ import annotations

import math

from lit.compare import stats
from lit.compare.analysis import NEEDS_SEEDS, Analysis
from lit.compare.plots import CURVES, DEPTH, DEPTH_QUANTITIES, FOREST

DASH = "—"
DEFAULT_DECIMALS = 4  # when no spread is known (one seed)


def value_decimals(analysis: Analysis) -> int:
    """Decimals showing two significant digits of the smallest spread the report has (baseline std or a
    paired interval's half-width), between 2 and 8."""
    spreads = [s for s in (analysis.baseline_std, analysis.median_half_width) if s]
    if not spreads:
        return DEFAULT_DECIMALS
    return min(8, max(2, 1 - math.floor(math.log10(min(spreads)))))


def render(analysis: Analysis, figures: list[str]) -> str:
    """The whole report; ``figures`` are the file names ``plots.draw_all`` wrote beside it."""
    d = value_decimals(analysis)
    sections = [_header(analysis), _variants(analysis, d), _against_baseline(analysis, d), _targets(analysis, d)]
    if analysis.depth is not None and DEPTH in figures:
        sections.append("## Depth profile\n\nRMS of the residual stream after each sublayer "
                        "(`diag/stream_rms/*`), mean over seeds, at the first and the last step the runs logged "
                        f"it.\n\n![depth profile]({DEPTH})")
    if DEPTH_QUANTITIES in figures:
        sections.append("## Outliers and sublayer contribution by depth\n\nPer sublayer, at the last step the runs "
                        "logged them, mean over seeds: excess kurtosis and max/median |activation| of the stream "
                        "(`diag/kurtosis/*`, `diag/max_median/*`), each branch's norm over the stream's and their "
                        "cosine (`diag/branch_ratio/*`, `diag/branch_cosine/*`), and the stream's cosine before and "
                        f"after the sublayer (`diag/io_cosine/*`).\n\n![depth quantities]({DEPTH_QUANTITIES})")
    shown = [f"{caption}\n\n![{alt}]({name})" for name, (alt, caption) in _captions(analysis).items()
             if name in figures]
    if shown:
        sections.append("## Figures\n\n" + "\n\n".join(shown))
    sections.append(_throughput_note(analysis))
    return "\n\n".join(sections) + "\n"


def _captions(a: Analysis) -> dict[str, tuple[str, str]]:
    """File name -> (alt text, caption) of the figures that are always drawn."""
    return {CURVES: ("validation curves", f"`{a.metric}` against steps, mean ± std over seeds; the second panel "
                                          "zooms in on the last quarter of training."),
            FOREST: ("forest plot", f"Final `{a.metric}` per variant with its {a.confidence:.0%} CI and seeds "
                                    f"(left); paired differences to `{a.baseline}` with their CI (right).")}


def _header(a: Analysis) -> str:
    spec, sweep = a.protocol, a.sweep
    seeds = spec.get("seeds") or sorted(set(sweep.runs["seed"]), key=stats.seed_order)
    steps = spec.get("steps")
    better = "lower" if a.mode == "min" else "higher"
    variants = "; ".join(f"`{v.label}`" + (" (baseline)" if v.label == a.baseline else "")
                         + (f": `{v.overrides}`" if v.overrides else "") for v in a.variants)
    lines = [
        f"# Sweep `{sweep.sweep_id[:8]}`: {a.metric}",
        "",
        f"Experiment `{sweep.experiment}`, parent run `{sweep.parent_id}`. Everything below is read back from "
        "MLflow: the parent's `protocol.json`, and the tags and metric histories of its child runs.",
        "",
        "## Protocol",
        "",
        f"- Recipe: `{spec.get('recipe', '?')}`, "
        + (f"{steps} training steps per run." if steps else "the recipe's own number of training steps."),
        f"- Variants ({len(a.variants)}): {variants}.",
        f"- Seeds: {', '.join(str(s) for s in seeds)} ({len(seeds)} per variant); runs of two variants that "
        "share a seed are compared as a pair.",
        f"- Metric: `{a.metric}`, {better} is better; each run counts with its value at its last logged step "
        "(not its best one).",
        f"- {_tuning(a)}",
        f"- Counted: {len(sweep.runs)} FINISHED final runs{_left_out(a)}.",
    ]
    return "\n".join(lines)


def _tuning(a: Analysis) -> str:
    tune = a.protocol.get("tune")
    if not tune:
        return "Tuning: none; every variant ran with the recipe's hyperparameters."
    values = tune.get("values") or []
    planned = len(values) * len(a.protocol.get("variants") or a.variants)
    reuse = ("yes: the run of the picked value, seed " f"{tune.get('seed')}, counts as that seed's run"
             if tune.get("reuse_seed_run") else "no: every seed run was trained anew")
    return (f"Tuning: `{tune.get('key')}` over {', '.join(str(v) for v in values)} per variant, "
            f"{tune.get('steps') or 'full'} steps at seed {tune.get('seed')}, picked by: {tune.get('rule', '?')}. "
            f"Budget: {len(values)} runs per variant, {planned} planned, {a.sweep.tune_runs} found. "
            f"Seed run reused: {reuse}.")


def _left_out(a: Analysis) -> str:
    notes = [f"{n} {status}" for status, n in sorted(a.sweep.left_out.items())]
    if a.sweep.replaced:
        notes.append(f"{a.sweep.replaced} superseded by a newer run of the same variant and seed")
    if a.without_metric:
        notes.append(f"{a.without_metric} without any `{a.metric}`")
    return f" (left out: {', '.join(notes)})" if notes else ""


def _variants(a: Analysis, d: int) -> str:
    confidence = f"{a.confidence:.0%} CI"
    tuned = f"tuned `{a.protocol['tune'].get('key')}`" if a.protocol.get("tune") else "tuned"
    spikes = any(v.spike_count is not None for v in a.variants)
    header = ["variant", "seeds", "mean ± std", confidence, tuned, "parameters", "throughput vs baseline"]
    header += ["spikes (final, mean)"] if spikes else []
    rows, at_edge = [], []
    for v in a.variants:
        name = f"{v.label} (baseline)" if v.label == a.baseline else v.label
        if _at_grid_edge(a, v.tuned):
            at_edge.append(v.label)
        if v.summary is None:
            rows.append([name, "0", DASH, DASH, v.tuned or DASH, DASH, DASH] + ([DASH] if spikes else []))
            continue
        s = v.summary
        spread = f"{s.mean:.{d}f} ± {s.std:.{d}f}" if s.std is not None else f"{s.mean:.{d}f}"
        row = [name, str(s.n), spread, _interval(s.interval, d) if s.interval else NEEDS_SEEDS, v.tuned or DASH,
               _count(v.parameters), _ratio(v.relative_throughput)]
        rows.append(row + ([_number(v.spike_count, 2)] if spikes else []))
    edge = ""
    if at_edge:
        edge = (f"\n\n**At the edge of the tuning grid:** {', '.join(at_edge)} picked the smallest or largest value "
                "tried; its best value may lie outside the grid, so its result is a bound, not its optimum. Widen "
                "the grid on that side and rerun the sweep to settle it.")
    return "## Variants\n\n" + _table(header, rows) + edge


def _at_grid_edge(a: Analysis, tuned: str | None) -> bool:
    """Whether a variant's tuned value is the smallest or largest of a numeric tuning grid."""
    tune = a.protocol.get("tune") or {}
    try:
        grid = sorted(float(v) for v in tune.get("values") or [])
        value = float(tuned) if tuned is not None else None
    except (TypeError, ValueError):  # a non-numeric grid (or several values) has no edge to speak of
        return False
    return value is not None and len(grid) > 2 and value in (grid[0], grid[-1])


def _against_baseline(a: Analysis, d: int) -> str:
    title = f"## Against the baseline `{a.baseline}`"
    if not a.comparisons:
        return f"{title}\n\nNo other variant has a counted run: nothing to compare."
    confidence = f"{a.confidence:.0%} CI"
    tested = sum(c.p_adjusted is not None for c in a.comparisons)
    better = (f"{'Lower' if a.mode == 'min' else 'Higher'} `{a.metric}` is better, so a "
              f"{'negative' if a.mode == 'min' else 'positive'} difference favours the variant.")
    if tested:
        method = (f"Per-seed differences (variant − baseline), runs paired by their seed; a two-sided paired t-test "
                  f"(`scipy.stats.ttest_rel`), its p-values Holm-adjusted over the {tested} tested comparisons of "
                  f"this report; a verdict needs an adjusted p below {a.alpha:.2g}. The {confidence} of the mean "
                  f"difference uses Student's t. {better}")
    else:
        method = ("Per-seed differences (variant − baseline), runs paired by their seed. No variant has ≥2 seeds in "
                  "common with the baseline, so no paired t-test was run and no p-value is given: a single "
                  f"difference carries no estimate of the noise it would have to beat. {better}")
    header = ["variant", "paired seeds", "mean difference", confidence, "p (paired t)", "p (Holm)", "verdict"]
    rows = []
    for c in a.comparisons:
        s = c.paired.summary
        rows.append([c.label, str(len(c.paired.seeds)), DASH if s is None else f"{s.mean:+.{d}f}",
                     _interval(s.interval, d, signed=True) if s and s.interval else NEEDS_SEEDS,
                     _p(c.paired.p_value), _p(c.p_adjusted), c.verdict])
    return "\n\n".join([title, method, _table(header, rows), _noise_floor(a, d)])


def _noise_floor(a: Analysis, d: int) -> str:
    if a.baseline_std is None:
        return f"**Noise floor:** unknown; it {NEEDS_SEEDS} (the baseline has one seed)."
    line = f"**Noise floor:** the baseline's seeds have a std of {a.baseline_std:.{d}f}"
    if a.median_half_width is None:
        return line + f"; a paired difference {NEEDS_SEEDS} in common with the baseline."
    return (line + f"; the {a.confidence:.0%} CI of a paired difference has a half-width of "
            f"{a.median_half_width:.{d}f} (median over variants): the smallest effect this sweep could have "
            "detected. More seeds narrow it (about as 1/√n).")


def _targets(a: Analysis, d: int) -> str:
    unit = _unit(a)
    tokens = any(t.tokens is not None for t in a.targets)
    intro = (f"## Steps to the baseline's final {a.metric} ({a.target:.{d}f})\n\n"
             "From each variant's mean curve over seeds (the validation steps every seed logged), linearly "
             f"interpolated between validation points; speedup = the baseline's final step "
             f"({a.baseline_final_step:g}) / that step."
             + (f" {unit.capitalize()} = steps × `train/items_per_step`." if tokens else ""))
    header = ["variant", "step"] + ([unit] if tokens else []) + ["speedup"]
    rows = []
    for t in a.targets:
        if t.step is None:
            rows.append([t.label, "not reached"] + ([DASH] if tokens else []) + [DASH])
        else:
            rows.append([t.label, f"{t.step:.0f}"] + ([_count(t.tokens)] if tokens else []) + [_ratio(t.speedup)])
    return intro + "\n\n" + _table(header, rows)


def _throughput_note(a: Analysis) -> str:
    with_rate = [v for v in a.variants if v.throughput is not None]
    lines = ["## Throughput and parameters", ""]
    if with_rate:
        metric = with_rate[0].throughput_metric
        rates = ", ".join(f"{v.label} {v.throughput:,.0f}" for v in with_rate)
        lines.append(f"Throughput is the median of each run's `{metric}` history (robust to compile warm-up and "
                     f"validation pauses), averaged over seeds: {rates}. A ratio means something only between runs "
                     "on the same kind of machine under the same load: children of a local sweep that ran side by "
                     "side shared its cores.")
    else:
        lines.append("No run logged a throughput metric (`train/*_per_s`).")
    lines.append("")
    lines.append("Parameters are each run's `model/parameters`. A variant that wins with more parameters may win "
                 "by size alone; compare at equal size, or read the steps-to-target table against the "
                 "throughput ratio for a cost-aware view.")
    return "\n".join(lines)


def _unit(a: Analysis) -> str:
    metric = next((v.throughput_metric for v in a.variants if v.throughput_metric), None) or ""
    name = metric.rsplit("/", 1)[-1]
    return name[:-len("_per_s")] if name.endswith("_per_s") else "items"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _interval(interval: tuple[float, float], d: int, signed: bool = False) -> str:
    sign = "+" if signed else ""
    return f"[{interval[0]:{sign}.{d}f}, {interval[1]:{sign}.{d}f}]"


def _p(p: float | None) -> str:
    return DASH if p is None else f"{p:.3g}"


def _ratio(ratio: float | None) -> str:
    return DASH if ratio is None else f"{ratio:.2f}×"


def _count(count: float | None) -> str:
    return DASH if count is None else f"{count:,.0f}"


def _number(value: float | None, decimals: int) -> str:
    return DASH if value is None else f"{value:.{decimals}f}"

