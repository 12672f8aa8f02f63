"""The secondary comparison of a ``--shared_value`` sweep: each variant at the *baseline's* tuned value, against the
baseline's seed runs, paired by seed.

The primary comparison puts each variant at its own tuned value and asks "is the variant, tuned, better than the
baseline, tuned?"; its verdicts stand, whatever this one says. This one asks a narrower question, "is the component
better at the same learning rate?", with runs that share the baseline's value and therefore pair more tightly with
its seeds (the measurement: docs/seed-noise.md). It is computed by the functions of the primary one
(``analysis.compare_to_baseline``: the paired t or sign-flip test, Holm's interval, the correlation, the MDE), in a
family of its own, and reported in a section after it.

Which runs count is written in ``lit/sweep/protocol.py``: those tagged ``SHARED_VALUE``, finished or diverged.
"""

from __future__ import annotations

from dataclasses import replace

import pandas as pd

from lit.compare import report as R
from lit.compare import stats
from lit.compare.analysis import Analysis, SharedValue, compare_to_baseline
from lit.sweep import protocol
from lit.sweep.grid import short_key

NO_RUN = "no counted run at the baseline's value yet"


def analyze_shared(a: Analysis) -> Analysis:
    """``a`` with its secondary comparison (``shared_value``) when its sweep ran ``--shared_value``; else ``a``."""
    sweep, confidence, mode = a.sweep, a.confidence, a.mode
    variants, primary = a.variants, a.comparisons
    base = next(v for v in variants if v.label == a.baseline)
    if not sweep.protocol.get("shared_value") or sweep.shared is None:
        return a
    key = short_key(str((sweep.protocol.get("tune") or {}).get("key") or "tuned value"))
    own = {v.label: v.tuned for v in variants if v.label != base.label}
    if base.label != sweep.protocol.get("baseline"):
        return replace(a, shared_value=SharedValue(key, None, (), None, own, {}, {}, note=(
            f"The runs at the baseline's value ran at `{sweep.protocol.get('baseline')}`'s tuned {key}; against "
            f"`{base.label}` (--baseline) they answer no question, so they are not compared.")))
    runs = sweep.shared
    final_ids = set(sweep.runs["run_id"])
    at_shared = []
    for v in variants:
        if v.label == base.label:
            continue
        mine = runs[runs["variant"] == v.label]
        finished = mine[(mine["outcome"] == protocol.FINISHED_OUTCOME) & mine["value"].notna()]
        values = dict(sorted(zip(finished["seed"].astype(str), finished["value"].astype(float), strict=True),
                             key=lambda item: stats.seed_order(item[0])))
        diverged = {str(s): (None if pd.isna(step) else int(step)) for s, step, outcome in
                    zip(mine["seed"], mine["diverged_step"], mine["outcome"], strict=True)
                    if outcome == protocol.DIVERGED_OUTCOME}
        at_shared.append(replace(v, values=values, diverged=diverged,
                                 summary=stats.summarize(list(values.values()), confidence) if values else None))
    comparisons, family = compare_to_baseline(at_shared, base, confidence, mode, None, {}, sweep)
    family = replace(family, name=f"{family.name}, at the baseline's value", declared=False)
    compared = {c.label for c in comparisons}
    return replace(a, shared_value=SharedValue(
        key=key, value=base.tuned, comparisons=tuple(comparisons), family=family, own_value=own,
        reused={label: int(((runs["variant"] == label) & runs["run_id"].isin(final_ids)).sum()) for label in own},
        primary_sd={c.label: c.paired.summary.std if c.paired.summary is not None else None for c in primary},
        missing=tuple(label for label in own if label not in compared)))


def render(a: Analysis) -> str | None:
    """The report's section on the secondary comparison (None without one), placed after the primary one."""
    s = a.shared_value
    if s is None:
        return None
    d = R.value_decimals(a)
    title = f"## At the baseline's {s.key} (secondary)"
    if s.note is not None:
        return f"{title}\n\n{s.note}"
    at = f"`{s.key}` = {s.value}" if s.value else f"the baseline's `{s.key}`"
    m = s.family.size
    intro = (
        f"**The verdicts of the primary comparison above (each variant at its own tuned {s.key}) stand; this one is "
        f"secondary and answers a narrower question: is the component better at the same {s.key}, the baseline's?** "
        f"Each variant but the baseline also ran its evaluation seeds at the baseline's tuned value ({at}, "
        "`--shared_value`), paired by seed with the baseline's seed runs; a variant that picked that value itself "
        "reuses its seed runs there (its differences are its primary ones). The tests, the Holm interval, corr. and "
        "the MDE are the primary section's, computed the same way, in a family of their own: Holm over these "
        f"{m} tested comparisons (MDE at α/m = {a.alpha / max(1, m):.3g}), apart from the primary family, whose "
        "verdicts they neither join nor change. Runs at one learning rate usually pair more tightly with the "
        "baseline's (compare the two paired-sd columns), so this comparison can resolve smaller differences; a "
        f"component that helps only once its {s.key} is retuned, or only at the baseline's, shows here as a verdict "
        "that differs from the primary one, and the primary one answers \"is it better, tuned?\".")
    header = ["variant", f"its own {s.key}", "paired seeds", "per-seed difference", "mean difference", "CI (Holm)",
              "p (paired t)", "p (sign-flip)", "sign-flip floor (Holm)", "test", "p (Holm)", "corr.", "paired sd",
              f"paired sd at its own {s.key}", "MDE (80%)", f"verdict at the baseline's {s.key}"]
    rows = []
    for c in s.comparisons:
        summary = c.paired.summary
        pairs = str(len(c.outcomes)) + (f" ({len(c.excluded)} diverged: not in t)" if c.excluded else "")
        rows.append([c.label, _own(s, c.label), pairs, R._differences(c, d, a.mode),
                     R.DASH if summary is None else f"{summary.mean:+.{d}f}", R._holm_interval(c, d),
                     "undefined (zero spread)" if c.paired.zero_spread else R._p(c.paired.p_value),
                     R._p(c.p_sign_flip), R._sign_flip_floor(len(c.outcomes), m, a.alpha), c.test or R.DASH,
                     R._p(c.p_adjusted),
                     R.DASH if c.correlation is None else f"{c.correlation:+.2f}",
                     R._number(summary.std if summary is not None else None, d),
                     R._number(s.primary_sd.get(c.label), d), R._number(c.mde, d), c.verdict])
    rows += [[label, _own(s, label)] + [R.DASH] * (len(header) - 3) + [NO_RUN] for label in s.missing]
    return "\n\n".join([title, intro, R._table(header, rows)])


def _own(s: SharedValue, label: str) -> str:
    reused = s.reused.get(label, 0)
    return (s.own_value.get(label) or "—") + (f" (the baseline's: {reused} seed runs reused)" if reused else "")
