"""A sequential sweep, look by look: ``--looks 3,6,9,12`` spends seeds only where a question is still open.

The looks are declared with the sweep (cumulative paired seeds, the last one the maximum) and stored in the
protocol's ``"sequential"`` field with the boundary (O'Brien-Fleming-type alpha spending), the family's alpha and
the effect of interest of the futility rule. Every invocation of the sweep command first performs each look whose
runs are all done, in order: it reads the finished runs from the store, replays the decisions from the first look
(``lit/statistics/sequential.py``, the same code ``compare`` runs) and records the look under the parent run as
``looks/look_<k>.json``, never rewritten (``lit/sweep/history.py``). Then it runs the next look's seeds: for every
comparison still open, and for the baseline while any is. A local launch loops until nothing is open; under
SLURM each invocation writes the next look's job arrays into ``<out>/look_<k>/`` and the next invocation, once
they have run, performs that look.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from lit.errors import UserInputError
from lit.sweep import protocol as P
from lit.sweep.grid import Child

NEXT_LOOK = -99  # what a local pass of the sweep answers its own loop (never an exit code): go on to the next look
SPENDING_CHOICES = ("obrien_fleming", "pocock")  # lit.statistics.sequential.SPENDING's names


def add_options(p) -> None:
    """The sequential options of ``cli.py sweep``."""
    p.add_argument("--looks", metavar="N1,N2,...",
                   help="a sequential sweep: look at the comparisons after N1, N2, ... paired seeds (increasing, "
                        "each >= 2; the last is the maximum); an open comparison gets the next look's seeds, a "
                        "settled one (better/worse, or futile) stops. The family's error rate holds over the looks "
                        "(O'Brien-Fleming-type alpha spending, group-sequential Holm); see docs/sweeps.md")
    p.add_argument("--effect_of_interest", type=float, default=None, metavar="E",
                   help="with --looks: the mean paired difference worth finding, in the metric's units; at every "
                        "look but the last that has at least 4 paired seeds, a comparison stops for futility when "
                        "even the maximum seeds would find an effect of max(E, |current estimate|) with less than "
                        "10%% conditional power (never at the last look: with --looks 2,4 or 3,6 the rule cannot "
                        "act). An effect larger than E is not guaranteed its power: a comparison whose estimate "
                        "happens to fall low can still stop, and a smaller E stops more (its cost in power: "
                        "docs/sequential.md)")
    p.add_argument("--spending", choices=SPENDING_CHOICES, default=None,
                   help="with --looks: the alpha-spending function (default obrien_fleming: almost nothing spent "
                        "early, the last look close to a fixed design's)")


def parse_looks(text: str) -> tuple[int, ...]:
    """``3,6,9,12`` -> (3, 6, 9, 12): at least two looks, each at least 2 paired seeds, increasing."""
    try:
        looks = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise UserInputError(f"--looks {text!r} is not a list of seed counts, like --looks 3,6,9,12") from None
    if len(looks) < 2:
        raise UserInputError(f"--looks {text} declares one look: that is a fixed sweep; run it with --seeds "
                             f"{looks[0]}, or declare two or more looks")
    if looks[0] < 2:
        raise UserInputError(f"--looks {text}: a look needs at least 2 paired seeds for a test, got {looks[0]}")
    bad = next((i for i in range(1, len(looks)) if looks[i] <= looks[i - 1]), None)
    if bad is not None:
        raise UserInputError(f"--looks {text} is not increasing ({looks[bad - 1]} then {looks[bad]}): each look "
                             "counts the paired seeds so far")
    return looks


def plan_of(a) -> dict | None:
    """The protocol's ``"sequential"`` field from the options, None for a fixed sweep. Settles ``a.seeds``: the
    last look under ``--looks``, else ``--seeds`` (default 3)."""
    if a.looks is None:
        for option, given in (("--effect_of_interest", a.effect_of_interest is not None),
                              ("--spending", a.spending is not None)):
            if given:
                raise UserInputError(f"{option} is read only with --looks N1,N2,... (a sequential sweep)")
        a.seeds = 3 if a.seeds is None else a.seeds
        return None
    looks = parse_looks(a.looks)
    refused = [("--add_seeds", "extends a fixed sweep by hand, an unplanned look; a sequential sweep runs the "
                               "seeds its looks ask for"),
               ("--family", "shares Holm with other sweeps, whose looks this sweep cannot see; a sequential "
                            "sweep is its own family"),
               ("--equivalence_margin", "tests parity at one look; a sequential equivalence test is not "
                                        "implemented"),
               ("--ladder", "trains every rung; a sequential ladder is not implemented")]
    given = {"--add_seeds": a.add_seeds, "--family": a.family, "--equivalence_margin": a.equivalence_margin,
             "--ladder": getattr(a, "ladder", None)}
    for option, why in refused:
        if given[option]:
            raise UserInputError(f"--looks with {option}: {option} {why}; drop one of them")
    if a.seeds is not None and a.seeds != looks[-1]:
        raise UserInputError(f"--seeds {a.seeds} with --looks {a.looks}: the last look ({looks[-1]}) is the "
                             "maximum number of seeds; drop --seeds")
    if a.effect_of_interest is not None and not (a.effect_of_interest > 0 and math.isfinite(a.effect_of_interest)):
        raise UserInputError(f"--effect_of_interest must be a positive difference in the metric's units, got "
                             f"{a.effect_of_interest}")
    a.seeds = looks[-1]
    from lit.statistics.sequential import OBRIEN_FLEMING, Plan

    return Plan(looks, spending=a.spending or OBRIEN_FLEMING, effect_of_interest=a.effect_of_interest).to_json()


@dataclass(frozen=True)
class LookState:
    """Where a sequential sweep stands when an invocation starts: the look it runs now, or finished."""

    look: int  # 1-based: the look whose seeds run now (after the last one recorded)
    of: int
    seeds: int  # paired seeds of this look
    children: list[Child]  # the runs this look needs (the done ones included: they are skipped)
    open: tuple[str, ...]  # the variants whose comparison is open
    finished: bool  # nothing left to run: every comparison settled, or the last look recorded
    recorded: tuple[str, ...] = ()  # one line per look this invocation recorded

    def folder(self, out: Path) -> Path:
        """Where a SLURM launch writes this look's manifest and job arrays (each look has its own)."""
        return out / f"look_{self.look}"

    def describe(self) -> str:
        if self.finished:
            return "; the sequential plan is settled, nothing left to run"
        who = (f"{len(self.open)} open comparison{'s' if len(self.open) > 1 else ''} and the baseline"
               if self.look > 1 else "every variant")
        return f"; look {self.look} of {self.of}: {self.seeds} paired seeds for {who}"


def advance(client, experiment_id: str, parent, proto: dict, children: list[Child]) -> LookState:
    """Record every look whose runs are all done (in order, each once), then say which look runs now and with
    which children. ``parent`` None: a new sweep, at its first look."""
    from lit.statistics.sequential import Plan, replay
    from lit.sweep.history import read_looks, write_look

    plan = Plan.from_json(proto["sequential"])
    seeds = [str(s) for s in proto["seeds"]]
    baseline = proto["baseline"]
    variants = [v["label"] for v in proto["variants"] if v["label"] != baseline]
    records = read_looks(client, parent.info.run_id) if parent is not None else []
    recorded: list[str] = []
    while True:
        look = len(records) + 1
        still_open = tuple(variants if look == 1 else records[-1]["open"])
        if look > plan.count or not still_open:
            return LookState(min(look, plan.count), plan.count, plan.looks[min(look, plan.count) - 1], [],
                             still_open, True, tuple(recorded))
        n = plan.looks[look - 1]
        wanted = look_children(children, [int(s) for s in seeds[:n]], set(still_open) | {baseline}, look == 1)
        state = LookState(look, plan.count, n, wanted, still_open, False, tuple(recorded))
        if parent is None:
            return state
        counted, hopeless = counted_runs(client, experiment_id, proto["sweep_id"],
                                         len((proto.get("tune") or {}).get("values") or []))
        pending = [c for c in wanted if c.phase == P.SEED_PHASE and (c.variant, str(c.seed)) not in counted
                   and c.variant not in hopeless]
        if pending:
            return state
        # Every comparison, settled ones too: the decisions are replayed from the first look, as compare does.
        outcomes = paired_outcomes(client, counted, proto, {baseline, *variants} - hopeless)
        result = replay({label: outcomes.get(label, {}) for label in variants}, seeds, plan, look)
        record = result.look_record(look)
        write_look(client, parent.info.run_id, record)
        records.append(record)
        recorded.append(describe_look(record, plan.effect_of_interest, plan.futility_power))


def look_children(children: list[Child], seeds: list[int], labels: set[str], tuning: bool) -> list[Child]:
    """The runs a look needs: the look's seeds of ``labels`` (the open ones and the baseline), and at the first
    look the tuning runs (a later look's seeds read the values tuning picked from the store)."""
    return [c for c in children if c.variant in labels
            and (c.seed in seeds if c.phase == P.SEED_PHASE else tuning)]


def counted_runs(client, experiment_id: str, sweep: str, tuning_values: int) -> tuple[dict, set[str]]:
    """((variant, seed) -> its counted seed run (tagged final and done; the latest), the variants diverged at every
    one of their ``tuning_values`` tuning values, whose seeds never run)."""
    from lit.sweep.store import child_runs, outcome

    counted, tuning = {}, {}
    for run in sorted(child_runs(client, experiment_id, sweep), key=lambda r: r.info.start_time):
        tags = run.data.tags
        done = outcome(run)
        if tags.get(P.PHASE) == P.TUNE_PHASE and done is not None:
            tuning.setdefault(tags.get(P.VARIANT), {})[tags.get(P.CHILD_KEY)] = done
        if done is not None and P.is_true(tags.get(P.FINAL)):
            counted[(tags.get(P.VARIANT), tags.get(P.SEED))] = run
    # Only once every value is done: a variant whose first value diverged may still find a good one.
    hopeless = {v for v, by_key in tuning.items()
                if len(by_key) == tuning_values and set(by_key.values()) == {P.DIVERGED_OUTCOME}}
    return counted, hopeless


def paired_outcomes(client, counted: dict, proto: dict, labels: set[str]) -> dict[str, dict[str, float]]:
    """Per variant of ``labels`` but the baseline: seed -> variant - baseline of the report metric, for each seed
    both ran; a diverged run is the worst outcome (±inf against its side), both diverged 0, as ``compare`` pairs."""
    from lit.sweep.store import final_metric, outcome

    metric = proto.get("report_metric") or proto["metric"]
    worse = math.inf if proto["mode"] == "min" else -math.inf
    values: dict[str, dict[str, float]] = {}
    for (variant, seed), run in counted.items():
        if variant in labels:
            diverged = outcome(run) == P.DIVERGED_OUTCOME
            values.setdefault(variant, {})[seed] = math.nan if diverged else final_metric(client, run, metric)
    base = values.get(proto["baseline"], {})
    pairs: dict[str, dict[str, float]] = {}
    for variant, by_seed in values.items():
        if variant == proto["baseline"]:
            continue
        pairs[variant] = {}
        for seed in set(by_seed) & set(base):
            mine, theirs = by_seed[seed], base[seed]
            if math.isnan(mine) and math.isnan(theirs):
                pairs[variant][seed] = 0.0
            elif math.isnan(mine):
                pairs[variant][seed] = worse
            elif math.isnan(theirs):
                pairs[variant][seed] = -worse
            else:
                pairs[variant][seed] = mine - theirs
    return pairs


def futility_effect(estimate: float | None, effect: float) -> str:
    """The effect a futile comparison's conditional power was computed at, in words: the rule takes the larger of
    E and the comparison's estimate at that look (``sequential.decide``), not E alone."""
    if estimate is None or not math.isfinite(estimate):
        return f"±max(E {effect:g}, |estimate|)"
    return f"±{max(effect, abs(estimate)):.3g} = max(E {effect:g}, |estimate| {abs(estimate):.3g})"


def describe_look(record: dict, effect: float | None, futility_power: float) -> str:
    """One line per recorded look: what was decided, what stays open, what runs next."""
    k, n = record["look"], record["seeds"]
    parts = []
    for c in record["comparisons"]:
        if c["look"] != k:
            continue
        if c["state"] == "rejected":
            crossed = c["p_values"][c["boundary_look"] - 1]  # the look whose statistic crossed (Holm may act later)
            parts.append(f"{c['label']} decided ({'higher' if c['direction'] > 0 else 'lower'} than the "
                         f"baseline; p {crossed:.3g} against boundary {c['boundary_p']:.3g} at look "
                         f"{c['boundary_look']})")
        elif c["state"] == "futile":
            parts.append(f"{c['label']} stopped for futility (conditional power {c['conditional_power']:.2f} < "
                         f"{futility_power:g} at {futility_effect(c.get('mean'), effect)})")
        elif c["state"] == "retained":
            parts.append(f"{c['label']} not distinguishable at the last look")
    if record["open"]:
        parts.append(f"open: {', '.join(record['open'])} -> look {k + 1} runs {record['next_seeds']} seeds")
    return f"look {k} of {record['of']} ({n} seeds): " + ("; ".join(parts) or "nothing decided")
