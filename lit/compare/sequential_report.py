"""A sweep's looks in the report: the verdicts of a sequential sweep, and the extensions of a fixed one.

A sequential sweep (the protocol's ``"sequential"``) is decided by its looks, not by a test over whatever seeds
each comparison ended with: ``sequential_verdicts`` replays the looks from the runs with the sweep's own rule
(``lit/statistics/sequential.py``), checks the replay against the looks the sweep recorded, and puts "decided at look
k of K" in each verdict. ``render`` writes the section that shows the plan, each look's boundary, and each
comparison's course. A fixed sweep extended by ``--add_seeds`` outside such a plan is said to be an interim look.

Nothing here imports ``analysis`` (which calls in): the comparisons come in as they are and go out replaced.
"""

from __future__ import annotations

import math
from dataclasses import replace

from lit.compare import stats
from lit.statistics.sequential import FUTILITY_MIN_PAIRS, Plan, SequentialResult, critical_t, replay

DECIDED, FUTILE, LAST, OPEN = ("{verdict} (decided at look {look} of {of})",
                               "not distinguishable (stopped for futility at look {look} of {of})",
                               "not distinguishable (look {look} of {of}, the last)",
                               "open after look {look} of {of} (no verdict yet)")


def sequential_verdicts(protocol: dict, looks: list[dict], comparisons: list, mode: str, baseline: str,
                        metric: str) -> tuple[list, SequentialResult | None, list[str]]:
    """(the comparisons with their sequential verdicts, the replayed result, notes for the report). Outside a
    sequential sweep, or when the report is not the one the looks decided (another baseline or metric), the
    comparisons come back unchanged with a note saying why."""
    spec = protocol.get("sequential")
    if not spec:
        return comparisons, None, []
    decided_on = protocol.get("report_metric") or protocol.get("metric")
    if baseline != protocol.get("baseline") or metric != decided_on:
        return comparisons, None, [
            f"This sweep is sequential: its looks decided `{decided_on}` against `{protocol.get('baseline')}`. "
            "This report compares something else, so its verdicts are fixed-sample readings of the runs the looks "
            "asked for, not decisions."]
    plan = Plan.from_json(spec)
    seeds = [str(s) for s in protocol.get("seeds") or []]
    result = replay({c.label: dict(c.outcomes) for c in comparisons}, seeds, plan, len(looks))
    by_label = {c.label: c for c in result.comparisons}
    replaced = []
    for c in comparisons:
        course = by_label.get(c.label)
        if course is not None:
            c = replace(c, verdict=verdict(course, plan, result.looks_done, mode))
        elif not looks:  # no look recorded yet: whatever the runs show so far decides nothing
            c = replace(c, verdict=OPEN.format(look=0, of=plan.count))
        replaced.append(c)
    return replaced, result, disagreements(result, looks)


def verdict(course, plan: Plan, looks_done: int, mode: str) -> str:
    """A comparison's verdict in the sequential design's terms."""
    if course.state == "rejected":
        said = stats.BETTER if stats.improvement(course.direction, mode) > 0 else stats.WORSE
        return DECIDED.format(verdict=said, look=course.look, of=plan.count)
    if course.state == "futile":
        return FUTILE.format(look=course.look, of=plan.count)
    if course.state == "retained":
        return LAST.format(look=course.look, of=plan.count)
    return OPEN.format(look=looks_done, of=plan.count)


def disagreements(result: SequentialResult, looks: list[dict]) -> list[str]:
    """Where the looks the sweep recorded differ from the replay from today's runs (the store changed since)."""
    notes = []
    for record, after in zip(looks, result.by_look, strict=False):
        recorded = {c["label"]: c["state"] for c in record.get("comparisons", [])}
        replayed = {c.label: c.state for c in after}
        if recorded != replayed:
            differ = sorted(k for k in set(recorded) | set(replayed) if recorded.get(k) != replayed.get(k))
            notes.append(f"**The recorded look {record.get('look')} and the replay from the runs disagree** on "
                         f"{', '.join(differ)} (recorded: {', '.join(str(recorded.get(k)) for k in differ)}; "
                         f"replayed: {', '.join(str(replayed.get(k)) for k in differ)}): runs changed in the store "
                         "after the look. The verdicts below are the replay's.")
    return notes


def header_notes(protocol: dict, looks: list[dict], extensions: list[dict]) -> list[str]:
    """Protocol bullets: the sequential plan, or the extensions that made a fixed sweep's verdicts an interim
    look."""
    notes = []
    spec = protocol.get("sequential")
    if spec:
        plan = Plan.from_json(spec)
        notes.append(f"Sequential: looks at {', '.join(str(n) for n in plan.looks)} paired seeds, "
                     f"{len(looks)} of {plan.count} recorded; {_spending(plan)}; see *Sequential looks* below.")
    for e in extensions:
        notes.append(f"**Extended from {e.get('from_seeds')} seeds (an interim look)** to {e.get('to_seeds')} by "
                     f"`--add_seeds` outside a sequential plan (recorded {e.get('recorded_at', '?')}): verdicts read "
                     f"at {e.get('from_seeds')} seeds were a look at the same family, so the family-wise error of "
                     "these verdicts is above α (looking at 3, 6, 9 and 12 seeds and stopping when significant "
                     "takes α = 0.05 to 0.14; docs/sweeps.md).")
    return notes


def _spending(plan: Plan) -> str:
    kind = "O'Brien-Fleming-type" if plan.spending == "obrien_fleming" else "Pocock-type"
    return (f"{kind} alpha spending (Lan-DeMets), α = {plan.alpha:g} over the family with a group-sequential Holm; "
            f"{plan.futility_rule()}")


def repeated_interval_text(c, digits: int) -> str:
    interval = c.repeated_interval
    if interval is None:
        return "—"
    return f"[{interval[0]:+.{digits}f}, {interval[1]:+.{digits}f}]"


def render(result: SequentialResult, notes: list[str], digits: int = 3) -> str:
    """The report's *Sequential looks* section."""
    plan = result.plan
    m = len(result.comparisons)
    lines = ["## Sequential looks", "",
             f"Declared with the sweep: looks at {', '.join(str(n) for n in plan.looks)} paired seeds (the last the "
             f"maximum); {_spending(plan)}. At each look every open comparison is tested on its seeds, with the paired "
             "t at n − 1 df (the exact sign-flip test where a run diverged) against the look's boundary as a "
             "nominal p-level, for its Holm share α/|J| (J: the comparisons not yet decided; a decided one frees its "
             "share for the others). The levels spend the function's increments for the paired t at these "
             "seed counts (docs/sequential.md). Settled comparisons (decided, or futile) run no more "
             f"seeds; the baseline runs what an open one needs. {result.looks_done} of {plan.count} looks recorded "
             "under the parent run (`looks/look_<k>.json`); the verdicts above are the replay of those looks from "
             "the runs.", ""]
    header = ["look", "paired seeds", "α spent (the family's)", f"boundary at α/{m} (nominal p)", "\\|t\\| needed",
              "decided here", "open after"]
    rows = []
    for k in range(1, result.looks_done + 1):
        n = plan.looks[k - 1]
        level = plan.levels(plan.alpha / max(m, 1))[k - 1] if m else math.nan
        after = result.by_look[k - 1] if result.by_look else ()
        here = [c.label for c in after if c.look == k and c.state in ("rejected", "futile")]
        rows.append([str(k), str(n), f"{plan.spent(k):.3g}", f"{level:.3g}", _t(critical_t(level, n)),
                     ", ".join(here) or "—", ", ".join(c.label for c in after if not c.settled) or "—"])
    lines += _table(header, rows) + [""]
    header = ["variant", "decision", "at look", "paired seeds", "test", "p at each look", "boundary used",
              "repeated CI at that boundary", "conditional power"]
    rows = []
    for c in result.comparisons:
        decision = {"rejected": ("higher" if c.direction > 0 else "lower") + " than the baseline",
                    "futile": "stopped for futility", "retained": "not distinguishable at the last look",
                    "open": "open"}[c.state]
        boundary = (f"p < {c.boundary_p:.3g} at look {c.boundary_look}, share α/{round(plan.alpha / c.share)}"
                    + (f" (\\|t\\| ≥ {_t(c.critical_t)})" if c.test == "paired t" else ""))
        rows.append([c.label, decision, str(c.look or "—"), str(c.pairs), c.test,
                     "; ".join("—" if p is None else f"{p:.3g}" for p in c.p_values), boundary,
                     repeated_interval_text(c, digits),
                     "—" if c.conditional_power is None else f"{c.conditional_power:.2f}"])
    lines += _table(header, rows)
    if result.untestable:
        lines += ["", f"Not in the family (fewer than 2 paired seeds at the first look): "
                      f"{', '.join(result.untestable)}."]
    lines += ["", "*Repeated CI at that boundary*: the mean paired difference at the look of the boundary used, ± the "
                  "\\|t\\| that boundary needs × its standard error. It is the interval of the sequential decision: "
                  "it excludes 0 exactly when that look decided (— for a sign-flip look). *Conditional power*: at "
                  "the comparison's latest look where the futility rule was checked (— where it was not: "
                  + ("no effect of interest" if not plan.effect_of_interest else
                     f"fewer than {FUTILITY_MIN_PAIRS} paired seeds, or the last look") + "). The columns of "
                  "*Against the baseline* marked fixed-sample (the interval, the seeds × test examples interval, "
                  "p (Holm), q (BH), MDE) are computed as if each comparison's final seeds had been a fixed "
                  "design: they are for reading, not deciding, and a mean at the look where it crossed a boundary "
                  "leans away from 0."]
    lines += [f"\n{note}" for note in notes]
    return "\n".join(lines)


def _t(value: float) -> str:
    return "∞" if not math.isfinite(value) else f"{value:.3g}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |"
                                                                            for r in rows]
