"""The text suite's open leads, re-decided by a sequential sweep: seeds spent only where a question is still open.

The fixed design of the reproduction report (``benchmarks/reproduction.py``) gave every text variant 6 paired seeds
and left seven leads undecided. This preset runs those seven against the same baseline under the sweep's
sequential design (``cli.py sweep --looks``: O'Brien-Fleming-type alpha spending over looks at 3, 6, 9 and 12
seeds, group-sequential Holm over the seven, futility below an effect of interest of 0.03 nats) with every
parameter's init drawn by its name (the sweep default), and writes a table that puts each verdict next to the
seeds and core-hours it took and next to what the fixed design spent and decided.

The seven are a family of their own (a sequential sweep cannot share Holm with other sweeps, whose looks it cannot
see). Parity claims have no sequential equivalence test here, so TokenFormer's "matches or beats" is read as a
difference: a "better" reproduces it, a "worse" does not, and no verdict says nothing about parity.

Run from the repository root (a frozen checkout: a sweep's identity includes the commit)::

    OMP_NUM_THREADS=1 nice -n 5 python -m benchmarks.reproduction_leads --parallel 2
    python -m benchmarks.reproduction_leads --report-only

Writes docs/reproduction/leads/report.md (``cli.py compare``) and docs/reproduction/leads.md (the table).
"""

from __future__ import annotations

import argparse
import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from benchmarks.reproduction import CLAIMS, OUT, REPO, SUITES, _number, _p, compute_of, report_analysis
from lit.commands import main as cli
from lit.compare.analysis import Analysis
from lit.compare.runs import connect, find_parent
from lit.sweep import protocol
from lit.sweep.store import search_all_runs

EXPERIMENT = "reproduction3-leads"
STORE = "sqlite:///benchmarks/out/reproduction.db"  # where the leads ran (2026-11-27); the suites have one store each
LEADS = ("perinorm", "lns", "tokenformer", "attnres", "attnres_block", "mixnorm", "hyperconn")
LOOKS = (3, 6, 9, 12)
# 0.03 nats: the middle of the gains the leads' papers report at their scale (AttnRes 0.02-0.03, Peri-LN and LNS
# about 0.03-0.04 in loss terms); below it a comparison that cannot reach 10% conditional power stops for futility.
EFFECT_OF_INTEREST = 0.03
FIXED_SEEDS = 6  # what the fixed design gave every text variant


@dataclass(frozen=True)
class Earlier:
    """A lead's row in the fixed design's claims table (docs/reproduction/claims.md as of commit e63b02d,
    2026-11-24): its store did not outlive that machine, so the row is quoted, not recomputed."""

    pairs: int
    mean: str
    holm_p: float
    verdict: str


EARLIER = {
    "config=gpt_perinorm": Earlier(6, "-0.039 [-0.080, +0.002]", 0.0589, "undecided"),
    "config=gpt_lns": Earlier(6, "-0.011 [-0.056, +0.034]", 1.0, "undecided"),
    "config=gpt_tokenformer": Earlier(6, "+0.157 [-0.002, +0.317]", 0.0524, "undecided"),
    "config=gpt_attnres": Earlier(6, "-0.023 [-0.072, +0.025]", 0.474, "undecided"),
    "config=gpt_attnres_block": Earlier(6, "-0.015 [-0.046, +0.016]", 0.474, "undecided"),
    "config=gpt_mixnorm": Earlier(6, "-0.036 [-0.089, +0.016]", 0.196, "undecided"),
    # 3 seeds on the pages; a later sitting took it to 6 in a store that is gone.
    "config=gpt_hyperconn": Earlier(3, "-0.020 [-0.093, +0.053]", 0.408, "undecided"),
}


def sweep_args(parallel: int) -> list[str]:
    """The sequential sweep: the text suite's recipe, grid and budget, the seven leads, looks instead of seeds."""
    text = SUITES["text"]
    return ["--config", text.recipe, *(f"--variant=config=recipes/gpt_{name}.yaml" for name in LEADS),
            f"--looks={','.join(map(str, LOOKS))}", f"--effect_of_interest={EFFECT_OF_INTEREST}",
            f"--tune=model.lr={text.learning_rates}", f"--tune_steps={text.tune_steps}", f"--metric={text.metric}",
            f"--report_metric={text.report_metric}", f"--experiment={EXPERIMENT}", f"--tracking_uri={STORE}",
            f"--parallel={parallel}", f"--out={Path('benchmarks') / 'out' / 'leads'}", *text.budget]


def analyse() -> tuple[Analysis, list]:
    """compare's analysis of the sequential sweep (its verdicts are the looks'), and every child run."""
    client = connect(STORE)
    parent = find_parent(client, experiment=EXPERIMENT)
    runs = search_all_runs(client, parent.info.experiment_id,
                           f"tags.`{protocol.PARENT_RUN}` = '{parent.info.run_id}'")
    return report_analysis(client, parent, EXPERIMENT), runs


def of_phase(runs: list, phase: str) -> list:
    return [r for r in runs if r.data.tags.get(protocol.PHASE) == phase]


def fixed_cost(runs: list, seeds: int) -> float | None:
    """What the fixed design would spend on this variant: its tuning runs and ``seeds`` seed runs, at the mean
    time this sweep measured for a seed run (core-hours); None before a tuning and a seed run have ended."""
    tuning = compute_of(of_phase(runs, protocol.TUNE_PHASE))
    seeded = compute_of(of_phase(runs, protocol.SEED_PHASE))
    if not tuning.tuning_runs or not seeded.seed_runs:
        return None
    return tuning.run_hours + seeds * seeded.run_hours / seeded.seed_runs


def tuned_cell(analysis: Analysis, label: str) -> str:
    """The learning rate a variant's seeds ran at, and "grid edge: a bound" when it is the grid's first or last value
    (the optimum may lie beyond it, so the comparison is at a bound of that variant's quality, not its best)."""
    result = next((v for v in analysis.variants if v.label == label), None)
    if result is None or result.tuned is None:
        return "n/a"
    grid = [float(v) for v in SUITES["text"].learning_rates.split(",")]
    edge = any(float(value) in (grid[0], grid[-1]) for value in result.tuned.split(", "))
    return f"{result.tuned} (grid edge: a bound)" if edge else result.tuned


def by_variant(runs: list) -> dict[str, list]:
    grouped: dict[str, list] = {}
    for r in runs:
        grouped.setdefault(r.data.tags.get(protocol.VARIANT), []).append(r)
    return grouped


HEADER = ("| method | fixed design (2026-11-24): pairs, mean [Holm-level interval], Holm p, verdict | tuned lr | "
          "sequential: verdict | pairs | mean [interval (level)] | raw p | corr. | MDE | core-hours spent (tuning + "
          f"seeds) | core-hours of the fixed {FIXED_SEEDS}-seed design | of a fixed {LOOKS[-1]}-seed design |")


def hours(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def leads_table(analysis: Analysis, runs: list) -> str:
    """One row per lead: the fixed design's quoted row, the sequential verdict, and the compute each took; then the
    baseline's row (its seeds serve every comparison) and the totals."""
    grouped = by_variant(runs)
    methods = {c.variant: c.method for c in CLAIMS if c.suite == "text"}
    lines = [HEADER, "|" + "---|" * HEADER.count(" | ") + "---|"]
    totals = [0.0, 0.0, 0.0]  # spent, fixed design, fixed at the last look's seeds
    for variant in [*(f"config=gpt_{name}" for name in LEADS), analysis.baseline]:
        mine = grouped.get(variant, [])
        costs = (compute_of(mine).run_hours, fixed_cost(mine, FIXED_SEEDS), fixed_cost(mine, LOOKS[-1]))
        totals = [t + (c or 0.0) for t, c in zip(totals, costs, strict=True)]
        if variant == analysis.baseline:
            seeds = len(of_phase(mine, protocol.SEED_PHASE))
            head = [f"baseline ({variant}): its seeds run while any comparison is open", "",
                    tuned_cell(analysis, variant), "", str(seeds), "", "", "", ""]
        else:
            e = EARLIER[variant]
            head = [methods[variant], f"{e.pairs}, {e.mean}, {_p(e.holm_p)}, {e.verdict}",
                    tuned_cell(analysis, variant), *sequential_cells(analysis, variant)]
        lines.append("| " + " | ".join([*head, *map(hours, costs)]) + " |")
    spent, fixed, twelve = totals
    return ("\n".join(lines) + f"\n\nIn all: **{spent:.2f} core-hours** for the sequential sweep, against "
            f"{fixed:.2f} for the fixed {FIXED_SEEDS}-seed design and {twelve:.2f} for a fixed {LOOKS[-1]}-seed "
            "design of the same arms, each costed at the run times this sweep measured.\n")


def sequential_cells(analysis: Analysis, variant: str) -> list[str]:
    """verdict, pairs, mean [interval (its level)], raw p, correlation with the baseline per seed, MDE."""
    c = next((c for c in analysis.comparisons if c.label == variant), None)
    if c is None or c.paired.summary is None:
        return ["not run yet", "0", "", "", "", ""]
    level = f" ({1 - c.level:.2%})" if c.level is not None else ""
    interval = f" [{_number(c.interval[0], 3)}, {_number(c.interval[1], 3)}]{level}" if c.interval else ""
    return [c.verdict, str(len(c.paired.seeds)), f"{_number(c.paired.summary.mean, 3)}{interval}",
            _p(c.paired.p_value), "n/a" if c.correlation is None else f"{c.correlation:+.2f}",
            "n/a" if c.mde is None else f"{c.mde:.3f}"]


TITLE = f"""# The text leads, re-decided sequentially

Seven claims the fixed design left undecided at 6 seeds, re-run as one sequential sweep: the same baseline recipe,
grid and budget as [the text suite](../reproduction.md) (8 layers, 300 steps, `model.lr` tuned per variant over
1e-3, 2e-3, 6e-3, 2e-2 at 150 steps on seed 1336), looks at {', '.join(map(str, LOOKS))} paired seeds with
O'Brien-Fleming-type spending and group-sequential Holm over the seven at α = 0.05, futility below
{EFFECT_OF_INTEREST} nats, every parameter's init drawn by its name. How a look decides: [sequential
sweeps](../sequential.md). The sweep's own report (curves, per-seed values, each look's boundary):
[leads/report.md](leads/report.md).

Read each row with its caveats: the verdict is the look's (a boundary crossed, futility, or the last look); the
interval beside it is compare's fixed-sample interval at Holm's level (printed) over the seeds the comparison ran,
in nats of `test/loss`, for reading, not deciding (after a stop at a look it leans away from 0); "not
distinguishable" says nothing about effects below the row's MDE (80% power at α/7, from the 80% upper limit of its
paired sd); the core-hours are the runs' wall time on one core each, measured while other work shared the machine
(so they overstate core time, alike for every design costed here);
TokenFormer's parity claim is read as a difference (no sequential equivalence test); the fixed design's row is
quoted from its table (its runs drew init in construction order and are gone with their machine), so its costs
are this sweep's measured run times applied to its seed count. Written by
`python -m benchmarks.reproduction_leads --report-only`.

"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parallel", type=int, default=1, help="runs at once (default 1; 2 on an idle 2-core box)")
    parser.add_argument("--report-only", action="store_true", help="train nothing; write the report again")
    args = parser.parse_args()
    os.chdir(REPO)
    if not args.report_only:
        command = sweep_args(args.parallel)
        print("python cli.py sweep " + " ".join(shlex.quote(a) for a in command), flush=True)
        cli(["sweep", *command])
    compare = [f"--experiment={EXPERIMENT}", f"--tracking_uri={STORE}", f"--out={OUT / 'leads'}"]
    print("python cli.py compare " + " ".join(compare), flush=True)
    cli(["compare", *compare])
    analysis, runs = analyse()
    table = leads_table(analysis, runs)
    (OUT.parent / "reproduction" / "leads.md").write_text(TITLE + table)
    print(table)


if __name__ == "__main__":
    main()
