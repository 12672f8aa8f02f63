"""``python cli.py compare``: report a sweep's variants against its baseline, with seeds, intervals and tests.

``main(argv)`` is the whole command (``argv`` without the word ``compare``): it reads the sweep back from
MLflow, writes ``report.md`` and its PNGs into ``--out``, prints the Markdown on stdout and logs the same
files into the parent run under ``report/``. A mistake the user can fix ends in one ``error:`` line on
stderr and exit code 2, like the rest of the CLI.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from lit.compare import stats
from lit.compare.analysis import Analysis, analyze, family_name, tested_p_values, untestable
from lit.compare.plots import draw_all
from lit.compare.report import render, render_plan
from lit.compare.runs import Sweep, connect, family_parents, find_parent, load_sweep
from lit.compare.shared_value import analyze_shared
from lit.compare.shared_value import render as render_shared
from lit.errors import OneLineArgumentParser, UserInputError, one_line_errors
from lit.sweep import protocol
from lit.tracking.ui import where_to_look
from lit.tracking.uri import resolve_tracking_uri

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Run

REPORT_FILE = "report.md"
PROG = "cli.py compare"

DESCRIPTION = """\
Compare the variants of a sweep (`cli.py sweep`) against its baseline, from what the sweep logged to MLflow:
the parent run's protocol.json, the child runs' tags and their metric histories.

The report gives, per variant, the final metric per seed and over seeds (mean, std, interval; diverged and
collapsed seeds as outcomes), and against the baseline, paired by seed: the per-seed differences, a paired
t-test and an exact sign-flip test, Holm-adjusted within the sweep's family (BH q beside it), an interval in
step with Holm, the minimum detectable effect, equivalence (TOST) for parity claims, the speedup to each
baseline seed's final value, throughput and parameters, and a depth profile when the runs logged
diag/stream_rms/* metrics. The metric's direction comes from --mode, else the protocol, else its name
(val/loss: lower; val/acc1: higher); an unknown name needs --mode. A sweep run with --shared_value gets a
secondary comparison after the primary one: each variant at the baseline's tuned value, in a family of its own.

With --plan --effect E, prints instead, per comparison, the paired seeds needed to detect a difference of E.

With --scaling, reports a ladder sweep (`cli.py sweep --ladder`) instead: per variant, the fitted law L = E +
A C^-alpha (E shared, or pinned with --irreducible), the effective-compute multiplier against the baseline at each
rung and at --target_compute with paired-bootstrap intervals, the wall-clock multiplier beside it, whether the
multiplier changes with scale, the hold-out check at the largest rung, and loss-vs-compute and multiplier figures.
The report opens with its own checks (E against its bounds, the hold-out errors' signs, which variants' learning
rates were checked and where one sits at its grid's edge); a law that fails its hold-out is called a local
description and the per-rung multipliers come first. A rung where a variant's seed diverged is a failure of that
variant: an upper bound there, its target multiplier not estimable.

Writes report.md and PNG figures into --out, prints the Markdown, and logs the files into the parent run
under the artifact folder report/."""

EPILOG = """\
examples:
  python cli.py compare --experiment norms
  python cli.py compare --sweep 3f2a9c... --metric val/acc1 --baseline layernorm --out compare/norms
  python cli.py compare --experiment norms --require_test   # fail unless every variant has >=2 paired seeds
  python cli.py compare --experiment norms --parity rmsnorm --equivalence_margin 0.01
  python cli.py compare --experiment norms --plan --effect 0.02   # seeds needed to see a 0.02 difference
  python cli.py compare --experiment ladder --scaling --target_compute 1e13   # a ladder's multipliers"""


def confidence_level(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"--confidence must be a number between 0 and 1, like 0.95; got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineArgumentParser(prog=PROG, description=DESCRIPTION, epilog=EPILOG,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--experiment", metavar="NAME",
                       help="MLflow experiment: its most recently started sweep is reported")
    which.add_argument("--sweep", metavar="PARENT_RUN_ID", help="the run id of a sweep's parent run")
    parser.add_argument("--metric", help="metric to compare (default: the sweep's report_metric from "
                        "protocol.json, else the metric it tuned by)")
    parser.add_argument("--baseline", metavar="LABEL",
                        help="variant the others are compared with (default: the sweep's baseline)")
    parser.add_argument("--out", metavar="DIR", help="folder for report.md and the PNGs (default: "
                        "compare/<first 8 characters of the sweep id>)")
    parser.add_argument("--tracking_uri", metavar="URI", help="MLflow tracking store (default: "
                        "$MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in this folder)")
    parser.add_argument("--confidence", type=confidence_level, default=0.95,
                        help="confidence of the intervals; a verdict needs a Holm-adjusted p below 1 - this "
                             "(default: 0.95)")
    parser.add_argument("--require_test", action="store_true",
                        help="fail unless every variant can be tested against the baseline (>=2 paired seeds); "
                             "without it, such variants get means only")
    parser.add_argument("--mode", choices=stats.MODES,
                        help="min: lower is better; max: higher is better (default: the sweep's protocol, else known "
                             "metric names; required for a metric whose direction is unknown)")
    parser.add_argument("--equivalence_margin", type=positive_number, metavar="M",
                        help="test parity claims as equivalence within +-M of the baseline (two one-sided tests); "
                             "default: the protocol's equivalence margin")
    parser.add_argument("--parity", action="append", metavar="LABEL",
                        help="a variant whose claim is parity with the baseline (repeatable; default: the "
                             "protocol's); needs a margin")
    parser.add_argument("--no_family", action="store_true",
                        help="Holm over this sweep's comparisons only, even when its protocol names a family "
                             "shared with other sweeps")
    parser.add_argument("--plan", action="store_true",
                        help="print, per comparison, the paired seeds needed to detect --effect at 80%% power and "
                             "the family's alpha/m, and the MDE at today's seeds; writes no report")
    parser.add_argument("--effect", type=positive_number, metavar="E",
                        help="with --plan: the mean paired difference to detect, in the metric's units")
    scaling = parser.add_argument_group("ladder sweeps")
    scaling.add_argument("--scaling", action="store_true",
                         help="report a ladder sweep: laws, effective-compute multipliers with intervals, trend")
    scaling.add_argument("--irreducible", type=positive_number, metavar="E",
                         help="with --scaling: pin the laws' irreducible loss E (default: fitted, shared by all "
                              "variants)")
    scaling.add_argument("--target_compute", type=positive_number, metavar="FLOPS",
                         help="with --scaling: the compute the headline multiplier is read at (default: the "
                              "baseline's largest rung; at most 10x beyond it)")
    scaling.add_argument("--resamples", type=int, default=2000, metavar="B",
                         help="with --scaling: paired bootstrap resamples (default 2000)")
    scaling.add_argument("--calibration_ladders", type=int, default=200, metavar="N",
                         help="with --scaling: simulated ladders that check the interval at this ladder's noise "
                              "(default 200; 0 skips)")
    return parser


def positive_number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, like 0.01; got {text!r}")
    return value


@one_line_errors
def main(argv: list[str]) -> int:
    """Run ``compare`` with ``argv`` (the arguments after ``compare``); returns the exit code."""
    try:
        args = build_parser().parse_args(argv)
        return compare(args)
    except SystemExit as done:  # --help
        return done.code if isinstance(done.code, int) else 0


def compare(args: argparse.Namespace) -> int:
    """The command once its arguments are parsed: read, analyse, draw, write, publish."""
    if args.scaling:
        return compare_scaling(args)
    for flag, value in (("--irreducible", args.irreducible), ("--target_compute", args.target_compute)):
        if value is not None:
            raise UserInputError(f"{flag} is read only with --scaling (a ladder sweep's report); add --scaling")
    if args.plan and args.effect is None:
        raise UserInputError("--plan needs --effect E: the mean paired difference to plan for, in the metric's "
                             "units (like --effect 0.02 for a loss)")
    if args.effect is not None and not args.plan:
        raise UserInputError("--effect is read only with --plan; add --plan to print the seeds it needs")
    client = connect(resolve_tracking_uri(args.tracking_uri))
    parent = find_parent(client, experiment=args.experiment, sweep_run_id=args.sweep)
    sweep = load_sweep(client, parent, args.metric)
    equivalence = parity_claims(args, sweep.protocol)
    others = {} if args.no_family else family_tests(client, parent, sweep, args)
    analysis = analyze_shared(analyze(sweep, sweep.metric, args.baseline, args.confidence, args.mode, equivalence,
                                      others))
    if args.plan:
        sys.stdout.write(render_plan(analysis, args.effect))
        return 0
    if args.require_test:
        require_tests(analysis)
    out = Path(args.out) if args.out else Path("compare") / sweep.sweep_id[:8]
    out.mkdir(parents=True, exist_ok=True)
    figures = draw_all(analysis, out)
    markdown = render(analysis, figures, render_shared(analysis))
    return write_report(client, sweep.parent_id, out, markdown, figures)


def write_report(client, parent_id: str, out: Path, markdown: str, figures: list[str]) -> int:
    """Write report.md beside its figures, log them to the sweep's parent run, and print the report."""
    (out / REPORT_FILE).write_text(markdown)
    publish(client, parent_id, out, [REPORT_FILE, *figures])
    sys.stdout.write(markdown)
    parent = client.get_run(parent_id)
    look = where_to_look(client._tracking_client.tracking_uri, parent.info.experiment_id, parent_id)
    sys.stderr.write(f"wrote {out / REPORT_FILE} and {len(figures)} figures; logged to run {parent_id} "
                     f"under {protocol.REPORT_DIR}/, {look}\n")
    return 0


def compare_scaling(args: argparse.Namespace) -> int:
    """``--scaling``: a ladder sweep's laws and multipliers, written and published like the comparison report."""
    from lit.compare.ladder_runs import load_ladder
    from lit.compare.scaling_report import analyze_scaling, draw_scaling, render_scaling

    if args.plan or args.effect is not None:
        raise UserInputError("--plan plans the seeds of a comparison at one size; drop it with --scaling")
    if args.resamples < 100:
        raise UserInputError(f"--resamples must be at least 100 for a usable interval, got {args.resamples}")
    if args.calibration_ladders < 0:
        raise UserInputError(f"--calibration_ladders must be 0 (skip) or more, got {args.calibration_ladders}")
    client = connect(resolve_tracking_uri(args.tracking_uri))
    parent = find_parent(client, experiment=args.experiment, sweep_run_id=args.sweep)
    sweep = load_ladder(client, parent, args.metric, args.baseline, args.mode)
    analysis = analyze_scaling(sweep, args.irreducible, args.target_compute, args.confidence, args.resamples,
                               args.calibration_ladders)
    out = Path(args.out) if args.out else Path("compare") / str(sweep.protocol.get("sweep_id", parent.info.run_id))[:8]
    out.mkdir(parents=True, exist_ok=True)
    figures = draw_scaling(analysis, out)
    markdown = render_scaling(analysis, figures)
    return write_report(client, sweep.parent_id, out, markdown, figures)


def parity_claims(args: argparse.Namespace, spec: dict) -> tuple[float, list[str]] | None:
    """(margin, parity labels) from the flags, each falling back on the protocol's ``equivalence``."""
    declared = spec.get("equivalence") or {}
    margin = args.equivalence_margin if args.equivalence_margin is not None else declared.get("margin")
    labels = args.parity if args.parity else declared.get("variants")
    if args.parity and margin is None:
        raise UserInputError(f"--parity {' '.join(args.parity)}: an equivalence test needs a margin; pass "
                             "--equivalence_margin M (the largest difference that still counts as parity)")
    if args.equivalence_margin is not None and not labels:
        raise UserInputError("--equivalence_margin: name the variants whose claim is parity with --parity LABEL "
                             "(this sweep's protocol declares none)")
    if margin is None:
        return None
    labels = [str(label) for label in labels]
    known = {v["label"] for v in spec.get("variants", [])}
    unknown = [label for label in labels if known and label not in known]
    if unknown:
        raise UserInputError(f"--parity {', '.join(unknown)}: not a variant of this sweep; pass one of "
                             f"{', '.join(sorted(known))}")
    return float(margin), labels


def family_tests(client: MlflowClient, parent: Run, sweep: Sweep,
                 args: argparse.Namespace) -> dict[str, tuple[list[float], list[float]]]:
    """The tests of the other sweeps of this sweep's declared family (same experiment), each analysed with its own
    protocol, so Holm runs over the whole family; empty when the protocol declares none."""
    name, declared = family_name(sweep.protocol, sweep.sweep_id)
    if not declared:
        return {}
    tests = {}
    for other in family_parents(client, parent, name):
        try:
            member = load_sweep(client, other)
            if member.sweep_id == sweep.sweep_id or member.sweep_id in tests:  # another parent of a sweep counted
                continue
            analysis = analyze(member, member.metric, None, args.confidence)  # its own protocol's parity claims
        except UserInputError as exc:
            raise UserInputError(f"sweep {other.info.run_id} of family {name!r} cannot be analysed ({exc}); finish "
                                 "it, or pass --no_family for Holm over this sweep alone") from None
        tests[member.sweep_id] = tested_p_values(analysis)
    return tests


def require_tests(analysis: Analysis) -> None:
    """``--require_test``: a report without a test for some variant is an error instead of means only."""
    missing = untestable(analysis)
    if not analysis.comparisons:
        raise UserInputError(f"--require_test: sweep {analysis.sweep.sweep_id} has no variant besides the baseline "
                             f"{analysis.baseline!r} with a counted run, so nothing can be tested")
    if missing:
        seeds = ", ".join(f"{c.label}: {len(c.paired.seeds)}" for c in analysis.comparisons if c.label in missing)
        raise UserInputError(f"--require_test: a paired test needs >=2 seeds both the variant and the baseline "
                             f"{analysis.baseline!r} finished (paired seeds {seeds}); run the sweep with more "
                             "seeds, or drop --require_test for means only")


def publish(client: MlflowClient, run_id: str, folder: Path, names: list[str]) -> None:
    """Log the report's files into the parent run under ``report/``, next to the protocol it reports on.
    Only this report's files: a folder reused from an earlier report may hold figures it no longer has."""
    for name in names:
        client.log_artifact(run_id, str(folder / name), protocol.REPORT_DIR)
