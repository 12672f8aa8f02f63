"""The report as Markdown: the protocol in words, then the numbers of ``Analysis``, with figures linked by
relative paths (the Markdown and its PNGs sit in one folder, locally and under the parent run's ``report/``).

Values are printed to the decimals the noise deserves: two significant digits of the sweep's spread, so a
0.002 difference between losses of 3.28 is visible and a 1e-7 one is not dressed up as a finding.
"""

from __future__ import annotations

import math

import numpy as np

from lit.compare import sequential_report, stats
from lit.compare.analysis import ALL_TUNING_DIVERGED, NEEDS_PAIRS, NEEDS_SEEDS, Analysis, Comparison, VariantResult
from lit.compare.plots import CURVES, DEPTH, DEPTH_QUANTITIES, FOREST
from lit.compare.runs import DUPLICATE_RULE

DASH = "—"
DEFAULT_DECIMALS = 4  # when no spread is known (one seed)
# Which std of the paired differences the MDE and the plan read (``stats.sd_upper_limit``), in words.
SD_ESTIMATE = (f"The std of the paired differences is read at its {stats.SD_CONFIDENCE:.0%} upper confidence limit, "
               "each comparison's from its own pairs (df n − 1: the observed std × √((n − 1) / "
               f"χ²({1 - stats.SD_CONFIDENCE:.1f}; n − 1)), {stats.sd_limit_factor(3):.2f}× at 3 pairs, "
               f"{stats.sd_limit_factor(6):.2f}× at 6, {stats.sd_limit_factor(10):.2f}× at 10), not at the observed "
               "std, which from a few seeds falls below the true one half the time.")


def value_decimals(analysis: Analysis) -> int:
    """Decimals showing two significant digits of the smallest spread the report has (baseline std or a
    paired interval's half-width), between 2 and 8."""
    spreads = [s for s in (analysis.baseline_std, analysis.median_half_width) if s]
    if not spreads:
        return DEFAULT_DECIMALS
    return min(8, max(2, 1 - math.floor(math.log10(min(spreads)))))


def render(analysis: Analysis, figures: list[str], secondary: str | None = None) -> str:
    """The whole report; ``figures`` are the file names ``plots.draw_all`` wrote beside it; ``secondary`` a section
    built above this module (``shared_value.render``), placed after the primary comparison."""
    d = value_decimals(analysis)
    sections = [_header(analysis), _variants(analysis, d), _against_baseline(analysis, d), _targets(analysis)]
    if analysis.sequential is not None or analysis.sequential_notes:  # decided look by look: say how
        sections.insert(3, sequential_report.render(analysis.sequential, list(analysis.sequential_notes), d)
                        if analysis.sequential is not None else "\n\n".join(analysis.sequential_notes))
    if secondary is not None:  # --shared_value: the secondary comparison, after the primary one
        sections.insert(len(sections) - 1, secondary)
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


def render_plan(analysis: Analysis, effect: float, power: float = stats.POWER) -> str:
    """``--plan``: per comparison, the paired seeds that would detect a difference of ``effect`` with ``power`` at
    the family's alpha / m, from the upper confidence limit of the std of its paired differences (the pilot's), and
    the MDE at today's n."""
    d = value_decimals(analysis)
    alpha = analysis.mde_alpha
    lines = [f"# Plan for sweep `{analysis.sweep.sweep_id[:8]}`: {analysis.metric}, effect {effect:g}", "",
             f"Seeds needed for a two-sided paired t-test to find a mean paired difference of {effect:g} with "
             f"{power:.0%} power at α / m = {analysis.alpha:.2g} / {analysis.family.size} = {alpha:.3g} (Holm's "
             f"strictest step, so the plan holds at any step). {SD_ESTIMATE} A plan from the observed "
             "std falls short of its power more often than not; this one falls short in about one pilot in five, "
             "at the price of more seeds than the true std needs (a larger pilot shrinks the factor). Leads picked "
             "as the largest of many are optimistic: they shrink on rerun.", ""]
    limit = f"{stats.SD_CONFIDENCE:.0%} upper limit of the std"
    header = ["variant", "paired seeds now", "std of paired differences", limit, "MDE now (80%)",
              f"seeds for {effect:g}"]
    rows = []
    for c in analysis.comparisons:
        s = c.paired.summary
        usable = len(c.paired.differences) >= 2
        pilot = np.asarray(c.paired.differences)[None, :]
        upper = float(stats.sd_upper_limit(pilot)[0]) if usable else None
        needed = float(stats.planned_seeds(effect, pilot, alpha, power)[0]) if usable else math.nan
        rows.append([c.label, str(len(c.paired.seeds)), _number(s.std if s is not None else None, d),
                     _number(upper, d), _number(c.mde, d), DASH if math.isnan(needed) else str(int(needed))])
    return "\n".join(lines) + "\n" + _table(header, rows) + "\n"


def _captions(a: Analysis) -> dict[str, tuple[str, str]]:
    """File name -> (alt text, caption) of the figures that are always drawn."""
    return {CURVES: ("validation curves", f"`{a.curve_of}` against steps, mean ± std over seeds; the second panel "
                                          "zooms in on the last quarter of training." + _curve_note(a)),
            FOREST: ("forest plot", f"Final `{a.metric}` per variant with its {a.confidence:.0%} CI and seeds "
                                    f"(left); paired differences to `{a.baseline}` with their unadjusted CI "
                                    "(right).")}


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
        *(f"- {note}" for note in sequential_report.header_notes(spec, list(sweep.looks), list(sweep.extensions))),
        f"- Metric: `{a.metric}`, {better} is better (from {a.mode_source}); {_metric_source(a)} Each run counts "
        "with its value at its last logged step (not its best one).",
        f"- {_tuning(a)}",
        f"- {_family(a)}",
        f"- Counted: {_counted(a)}{_left_out(a)}.",
    ]
    if sweep.duplicates:
        pairs = ", ".join(f"{v}/seed {s} ×{n}" for v, s, n in sweep.duplicates)
        lines.append(f"- Duplicate runs of one (variant, seed): {pairs}; rule applied: {DUPLICATE_RULE}.")
    return "\n".join(lines)


def _metric_source(a: Analysis) -> str:
    spec = a.protocol
    if spec.get("report_metric"):
        return (f"the sweep reports `{spec['report_metric']}` and tuned by `{spec.get('metric')}`."
                if a.metric == spec["report_metric"] else
                f"chosen with --metric (the sweep reports `{spec['report_metric']}`).") + _examples_note(a)
    return ("this sweep predates a separate report metric: the value reported is the one tuning picked by, on "
            "the same data." if spec.get("tune") and a.metric == spec.get("metric") else "")


def _examples_note(a: Analysis) -> str:
    sizes = a.examples_per_run
    if len(sizes) == 1:
        return f" Each run was scored on {sizes[0]:,} test examples (its `test_examples.npz`)."
    if sizes:
        return (f" **The runs were scored on different numbers of test examples ({', '.join(f'{n:,}' for n in sizes)})"
                "**: a `--trainer.limit_test_batches` or another split; their values are not comparable.")
    return ""


def _tuning(a: Analysis) -> str:
    tune = a.protocol.get("tune")
    if not tune:
        return "Tuning: none; every variant ran with the recipe's hyperparameters."
    values = tune.get("values") or []
    planned = len(values) * len(a.protocol.get("variants") or a.variants)
    return (f"Tuning: `{tune.get('key')}` over {', '.join(str(v) for v in values)} per variant, "
            f"{tune.get('steps') or 'full'} steps at seed {tune.get('seed')}. "
            f"Budget: {len(values)} runs per variant, {planned} planned, {a.sweep.tune_runs} found. "
            f"Rule: {_tuning_rule(a, tune)}")


def _tuning_rule(a: Analysis, tune: dict) -> str:
    rule = tune.get("rule")
    seeds = [str(s) for s in a.protocol.get("seeds") or []]
    if rule == "separate_seed":
        return (f"separate seed: tuning ran on seed {tune.get('seed')}, outside the evaluation seeds, and no "
                "tuning run is counted.")
    if rule == "reuse_seed_run" or tune.get("reuse_seed_run"):
        return (f"reuse (`{rule or 'reuse_seed_run'}`{'' if rule else ', read from an older protocol'}): the run "
                f"of the picked value, seed {tune.get('seed')}, counts as that seed's result, which biases each "
                "variant's mean toward its luckiest value.")
    on_seed = str(tune.get("seed")) in seeds
    return ("reuse (this sweep predates the tuning rule; its protocol says " + repr(rule) + "): "
            + (f"tuned on evaluation seed {tune.get('seed')}, whose seed runs were trained anew but share the "
               "data order tuning saw." if on_seed else "tuned on a seed outside the evaluation seeds.")
            if rule else "not recorded (an older protocol).")


def _family(a: Analysis) -> str:
    f = a.family
    if a.sequential is not None:  # the looks decide, not Holm over the final p-values (statistics-review-4 F4)
        return (f"Multiple comparisons: a sequential sweep is its own family ({f.size} tested comparisons); the "
                "group-sequential Holm over its looks decides the verdicts (*Sequential looks* below). Holm's "
                "p-values and BH q-values over the comparisons' final seeds are shown beside them as fixed-sample "
                "readings: they decide nothing.")
    where = (f"family `{f.name}`, declared in the protocol" if f.declared
             else "this sweep's own family (the protocol declares none)")
    sweeps = f" over {len(f.sweeps)} sweeps ({', '.join(s[:8] for s in f.sweeps)})" if len(f.sweeps) > 1 else ""
    parity = sum(c.equivalence is not None and c.equivalence.p_adjusted is not None for c in a.comparisons)
    union = (f" The equivalence tests of its {parity} parity claims are a second family, Holm-adjusted on their own; "
             f"by the union bound the chance of any false verdict in this report is at most 2α = {2 * a.alpha:.2g}."
             if parity else "")
    return (f"Multiple comparisons: {where}{sweeps}; Holm over its {f.size} tested comparisons decides the "
            "verdicts, BH q-values are shown beside them for screening." + union)


def _counted(a: Analysis) -> str:
    finished = int((a.sweep.runs["outcome"] == "finished").sum())
    diverged = int((a.sweep.runs["outcome"] == "diverged").sum())
    text = f"{finished} FINISHED final runs"
    if diverged:
        by_variant = ", ".join(f"{v.label} {len(v.diverged)}" for v in a.variants if v.diverged)
        text += f" and {diverged} diverged ({by_variant})"
    return text


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
    header = ["variant", "seeds", "per seed", "mean ± std", confidence, tuned, "parameters", "throughput vs baseline"]
    header += ["spikes (final, mean)"] if spikes else []
    rows, at_edge = [], []
    for v in a.variants:
        name = f"{v.label} (baseline)" if v.label == a.baseline else v.label
        if _at_grid_edge(a, v.tuned):
            at_edge.append(v.label)
        per_seed = _per_seed(v, d)
        if v.summary is None:
            seeds = (f"0 ({ALL_TUNING_DIVERGED}: {v.tuning_diverged[0]} of {v.tuning_diverged[1]})"
                     if v.diverged_at_every_tuning_value else _seed_count(v))
            rows.append([name, seeds, per_seed, DASH, DASH, v.tuned or DASH, DASH, DASH] + ([DASH] if spikes else []))
            continue
        s = v.summary
        spread = f"{s.mean:.{d}f} ± {s.std:.{d}f}" if s.std is not None else f"{s.mean:.{d}f}"
        row = [name, _seed_count(v), per_seed, spread, _interval(s.interval, d) if s.interval else NEEDS_SEEDS,
               v.tuned or DASH, _count(v.parameters), _ratio(v.relative_throughput)]
        rows.append(row + ([_number(v.spike_count, 2)] if spikes else []))
    notes = []
    if a.bounded:
        notes.append(f"`{a.metric}` is a proportion: its {confidence} is a t interval on the logit scale mapped "
                     "back (it cannot leave [0, 1]; seeds at exactly 0 or 1 are moved 1e-4 inside). A seed marked "
                     "*collapsed* ended closer to the worst value than half the baseline's median seed: a run that "
                     "stopped learning, counted as an outcome of its own and kept in the tests.")
    if any(v.diverged for v in a.variants):
        notes.append("A *diverged* seed's loss went non-finite (step shown); it has no final value, so it is left "
                     "out of the mean and the t-test, and enters the sign-flip test as the worst outcome.")
    if at_edge and _grid_size(a) == 2:
        notes.append("**A 2-value tuning grid cannot bracket an optimum:** every pick sits at an edge, so each "
                     "variant's result is a bound, not its optimum. Tune over 3 or more values to settle it.")
    elif at_edge:
        notes.append(f"**At the edge of the tuning grid:** {', '.join(at_edge)} picked the smallest or largest value "
                     "tried; its best value may lie outside the grid, so its result is a bound, not its optimum. "
                     "Widen the grid on that side and rerun the sweep to settle it.")
    return "## Variants\n\n" + _table(header, rows) + "".join(f"\n\n{n}" for n in notes)


def _seed_count(v: VariantResult) -> str:
    finished = len(v.values)
    parts = [f"{finished}"]
    if v.diverged:
        parts.append(f"+ {len(v.diverged)} diverged")
    if v.collapsed:
        parts.append(f"({len(v.collapsed)} collapsed)")
    return " ".join(parts)


def _per_seed(v: VariantResult, d: int) -> str:
    cells = {seed: f"{value:.{d}f}" + (" collapsed" if seed in v.collapsed else "")
             for seed, value in v.values.items()}
    for seed, step in v.diverged.items():
        cells[seed] = "diverged" + (f" at {step}" if step is not None else "")
    return "; ".join(f"{seed}: {cells[seed]}" for seed in sorted(cells, key=stats.seed_order)) or DASH


def _at_grid_edge(a: Analysis, tuned: str | None) -> bool:
    """Whether a variant's tuned value is the smallest or largest of a numeric tuning grid."""
    tune = a.protocol.get("tune") or {}
    try:
        grid = sorted(float(v) for v in tune.get("values") or [])
        value = float(tuned) if tuned is not None else None
    except (TypeError, ValueError):  # a non-numeric grid (or several values) has no edge to speak of
        return False
    return value is not None and len(grid) >= 2 and value in (grid[0], grid[-1])


def _grid_size(a: Analysis) -> int:
    return len((a.protocol.get("tune") or {}).get("values") or [])


def _against_baseline(a: Analysis, d: int) -> str:
    title = f"## Against the baseline `{a.baseline}`"
    if not a.comparisons:
        return f"{title}\n\nNo other variant has a counted run: nothing to compare."
    better = (f"{'Lower' if a.mode == 'min' else 'Higher'} `{a.metric}` is better, so a "
              f"{'negative' if a.mode == 'min' else 'positive'} difference favours the variant.")
    m = a.family.size
    method = (
        f"Per-seed differences (variant − baseline), runs paired by their seed. Two tests: the paired t-test (a "
        "one-sample t on the differences, as `scipy.stats.ttest_rel`) and an exact sign-flip test on the signed "
        "ranks (every one of the 2^n sign patterns; no normality needed; its smallest possible p is 2/2^n, which "
        "times m is the *sign-flip floor (Holm)* column: below the n it names, the exact test cannot decide). A "
        "verdict rests on the t-test when every paired seed finished on both sides and the differences spread, "
        "else on the sign-flip test (column *test*): a diverged seed enters it as the worst outcome, and equal "
        "differences, for which t is undefined, get its exact p. "
        f"{_decision_text(a, m)} {_mde_subject(a)} with 80% power "
        f"at α/m = {a.mde_alpha:.3g} (Holm's strictest step), from the std of the paired differences and the "
        f"number of pairs (noncentral t). {SD_ESTIMATE} corr. is Pearson's correlation between the variant's and "
        "the baseline's per-seed values over the finished paired seeds (— below 3): pairing helps when it is "
        "positive and costs when it is negative, since the paired differences have std "
        f"√(sd_v² + sd_b² − 2 ρ sd_v sd_b). {better}")
    parity = a.equivalence_margin is not None and any(c.equivalence for c in a.comparisons)
    if parity:
        method += (f" Parity claims are tested as equivalence: two one-sided t-tests against ±{a.equivalence_margin:g}"
                   " (p (TOST) raw, and Holm-adjusted over the family's parity claims: the verdict reads the "
                   "adjusted one); verdicts: equivalent within ±margin, "
                   "different (the difference test), or not shown equivalent.")
    two_way = any(c.two_way is not None for c in a.comparisons)
    if two_way:
        method += (" *CI, seeds × test examples* is the same level's interval for another draw of seeds and of a test "
                   "set of the same size (each run's per-example results, `test_examples.npz`: a t interval on the "
                   "two-way standard error of the seeds × examples grid, never narrower than the seed-only one, so "
                   "at few seeds, or wherever the seeds dominate, it is the seed-only interval by construction): "
                   "the seed-only verdict holds for this test split, and this interval shows how far it would "
                   "carry to another test set of the same size if the test examples are independent draws "
                   "(correlated ones, such as neighbouring windows of one text, make it too narrow; "
                   "docs/comparing-statistics.md). Verdicts rest on the seed-only tests, declared before the runs.")
    fixed = " (fixed-sample, not the decision)" if a.sequential is not None else ""
    header = ["variant", "paired seeds", "per-seed difference", "mean difference",
              "CI (fixed-sample, not the decision)" if fixed else "CI (Holm)"]
    header += [f"CI, seeds × test examples{fixed}"] if two_way else []
    header += ["p (paired t)", "p (sign-flip)", "sign-flip floor (Holm)", "test",
               "p (Holm, fixed-sample)" if fixed else "p (Holm)", "q (BH, fixed-sample)" if fixed else "q (BH)",
               "corr.", f"MDE (80%){fixed}"]
    header += ["p (TOST)", "p (TOST, Holm)"] if parity else []
    header += ["verdict"]
    rows = []
    for c in a.comparisons:
        s = c.paired.summary
        pairs = str(len(c.outcomes)) + (f" ({len(c.excluded)} diverged: not in t)" if c.excluded else "")
        row = [c.label, pairs, _differences(c, d, a.mode), DASH if s is None else f"{s.mean:+.{d}f}",
               _holm_interval(c, d)]
        row += [DASH if c.two_way is None else _interval(c.two_way, d, signed=True)] if two_way else []
        row += ["undefined (zero spread)" if c.paired.zero_spread else _p(c.paired.p_value), _p(c.p_sign_flip),
                _sign_flip_floor(len(c.outcomes), m, a.alpha), c.test or DASH, _p(c.p_adjusted), _p(c.q_value),
                DASH if c.correlation is None else f"{c.correlation:+.2f}", _number(c.mde, d)]
        e = c.equivalence
        row += [_p(e.p_value), _p(e.p_adjusted)] if parity and e else [DASH, DASH] if parity else []
        rows.append(row + [c.verdict])
    return "\n\n".join([title, method, _table(header, rows), _detectable(a, d)])


def _sign_flip_floor(n: int, m: int, alpha: float) -> str:
    """The smallest Holm-adjusted p the exact test can reach with n pairs in a family of m, and the n from which
    it could decide at all: below it, a comparison with a diverged seed cannot be decided, whatever it shows."""
    if n < 1:
        return DASH
    return f"{_p(min(1.0, m * stats.sign_flip_floor(n)))} (decides from n = {stats.sign_flip_decides_from(m, alpha)})"


def _differences(c: Comparison, d: int, mode: str) -> str:
    def cell(seed: str, x: float) -> str:
        if math.isinf(x):
            return "variant diverged" if stats.improvement(x, mode) < 0 else "baseline diverged"
        return "both diverged" if seed in c.excluded else f"{x:+.{d}f}"

    return "; ".join(f"{seed}: {cell(seed, x)}" for seed, x in c.outcomes.items()) or DASH


def _decision_text(a: Analysis, m: int) -> str:
    """What decides a verdict, in the method text: Holm's p and interval in a fixed sweep; the looks in a
    sequential one, where those columns are fixed-sample readings."""
    if a.sequential is not None:
        return (f"This sweep is sequential: its verdicts are the looks' decisions (*Sequential looks* below), and "
                "the interval that matches a decision is the repeated confidence interval printed there. Here p "
                f"(Holm, fixed-sample) is Holm over the {m} comparisons' final p-values, and the fixed-sample CI is "
                "drawn at the level Holm would use in a fixed design, as if each comparison's final seeds had been "
                "planned: neither decides, and neither need agree with the verdict. q (BH) is the "
                "Benjamini-Hochberg q over the same family, a screening column: it decides nothing.")
    return (f"p (Holm) is Holm-adjusted over the {m} tested comparisons of the family; a verdict needs it below "
            f"{a.alpha:.2g}. q (BH) is the Benjamini-Hochberg q over the same family, a screening column: it decides "
            "nothing. The CI (Holm) of each t-tested comparison is drawn at the per-comparison level Holm used for it "
            "(shown): α/(m − rank) while Holm rejects, then the level where it stopped, so it excludes 0 exactly when "
            "the verdict says different.")


def _mde_subject(a: Analysis) -> str:
    """What the MDE is, in the method text: this design's in a fixed sweep; in a sequential one a fixed design's
    at the comparisons' final seeds, since the looks spend α over several looks and stop early."""
    if a.sequential is not None:
        return ("MDE (fixed-sample): the smallest mean paired difference a fixed design at each comparison's final "
                "seeds would find, not the sequential design's (its looks spend α over several looks; its power at "
                "a planned effect is in docs/sequential.md),")
    return "MDE: the smallest mean paired difference this design finds"


def _holm_interval(c: Comparison, d: int) -> str:
    if c.interval is None:
        return DASH if c.test != "sign-flip" else "— (sign-flip verdict)"
    return f"{_interval(c.interval, d, signed=True)} at {1 - c.level:.2%}"


def _detectable(a: Analysis, d: int) -> str:
    mdes = [c.mde for c in a.comparisons if c.mde is not None]
    if not mdes:
        return (f"**Minimum detectable effect:** unknown; it {NEEDS_PAIRS} (no variant has 2 finished seeds in "
                "common with the baseline).")
    fixed = (" (fixed-sample: as if each comparison's final seeds had been a fixed design; the looks decide with "
             "less power than this, docs/sequential.md)" if a.sequential is not None else "")
    return (f"**Minimum detectable effect{' (fixed-sample)' if fixed else ''}:** {min(mdes):.{d}f} to "
            f"{max(mdes):.{d}f} (per comparison in the table{fixed}): a true mean difference at a row's MDE is found "
            f"at α/m = {a.mde_alpha:.3g} with 80% power or more "
            f"whenever the std's {stats.SD_CONFIDENCE:.0%} upper limit lies above the true std (4 reports in 5), and "
            "*not distinguishable* says nothing about effects below it. It shrinks with "
            "more seeds faster than 1/√n at small n (the t quantile falls too); `compare --plan --effect E` gives "
            "the seeds a given effect needs.")


def _curve_note(a: Analysis) -> str:
    """Why the curves read another metric than the compared one, when they do."""
    if a.curve_of == a.metric:
        return ""
    return (f" `{a.metric}` is read once per run, at the end, so it has no curve: the curves and the steps to target "
            f"read `{a.curve_of}`, the metric tuning picked by, logged at every validation.")


def _targets(a: Analysis) -> str:
    unit = _unit(a)
    tokens = any(t.tokens is not None for t in a.targets)
    note = _curve_note(a).lstrip()
    intro = (f"## Steps to the baseline's final {a.curve_of}\n\n" + (f"{note}\n\n" if note else "") +
             "Per seed: the target is the baseline seed's own final value; a run *reaches* it where its raw curve of "
             "the metric first gets to a value at or better than the target, linearly interpolated between the two "
             "logged points around that first crossing (no best-so-far smoothing: the first crossing counts). "
             "Speedup = the baseline seed's step / the variant's step at that seed, so the baseline is 1.00 by "
             "construction. A seed that never reached the target is censored: its speedup is at most the baseline "
             "step / its last step (printed ≤), and it counts as such: the median over all seeds, with the "
             "order-statistic interval for a median (distribution-free, at the report's level or above; its coverage "
             "is printed; too few seeds to reach the level give none), and a sign test of faster against slower "
             "(a censored seed is slower). "
             "Steps, not wall-clock time: divide by the relative throughput below for time."
             + (f" {unit.capitalize()} = the median step (a not-reached seed at its last step: ≥ when that decides "
                "it) × `train/items_per_step`." if tokens else ""))
    header = ["variant", "reached", "per-seed speedup", "median speedup", "interval (coverage)", "sign test p"]
    header += [unit] if tokens else []
    rows = []
    for t in a.targets:
        per_seed = "; ".join(f"{seed}: " + (_ratio(t.ratios[seed]) if seed in t.ratios else
                                            f"≤{_ratio(t.bounds[seed])} (not reached)" if seed in t.bounds else
                                            "not reached" if step is None else "at first point")
                             for seed, step in t.steps.items()) or DASH
        m = t.summary
        median = DASH if m is None else ("≤" if m.median_bounded else "") + _ratio(m.median)
        interval = (DASH if m is None else f"needs ≥{m.seeds_for_interval} seeds" if t.interval is None else
                    f"[{'≤' if m.low_bounded else ''}{t.interval[0]:.2f}, {t.interval[1]:.2f}] ({m.level:.1%})")
        row = [t.label, f"{t.reached} of {t.seeds}", per_seed, median, interval, _p(None if m is None else m.p_sign)]
        tokens_cell = DASH if t.tokens is None else ("≥" if t.tokens_bounded else "") + _count(t.tokens)
        rows.append(row + ([tokens_cell] if tokens else []))
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

