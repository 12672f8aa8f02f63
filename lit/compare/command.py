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

from lit.compare.analysis import Analysis, analyze, untestable
from lit.compare.plots import draw_all
from lit.compare.report import render
from lit.compare.runs import connect, find_parent, load_sweep
from lit.errors import OneLineArgumentParser, UserInputError
from lit.sweep import protocol
from lit.tracking.uri import resolve_tracking_uri

if TYPE_CHECKING:
    from mlflow import MlflowClient

REPORT_FILE = "report.md"
PROG = "cli.py compare"

DESCRIPTION = """\
Compare the variants of a sweep (`cli.py sweep`) against its baseline, from what the sweep logged to MLflow:
the parent run's protocol.json, the child runs' tags and their metric histories.

The report gives, per variant, the final metric over seeds (mean, std, t interval), a paired t-test against
the baseline over the seeds both ran (Holm-adjusted over all comparisons) with a plain verdict, the noise
floor of the sweep, the steps each variant needs to reach the baseline's final value, throughput and
parameters, and a depth profile when the runs logged diag/stream_rms/* metrics. Lower-is-better or
higher-is-better follows the metric (val/loss: lower; val/acc1: higher).

Writes report.md and PNG figures into --out, prints the Markdown, and logs the files into the parent run
under the artifact folder report/."""

EPILOG = """\
examples:
  python cli.py compare --experiment norms
  python cli.py compare --sweep 3f2a9c... --metric val/acc1 --baseline layernorm --out compare/norms
  python cli.py compare --experiment norms --require_test   # fail unless every variant has >=2 paired seeds"""


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
    parser.add_argument("--metric", help="metric to compare (default: the sweep's own, from protocol.json)")
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
    return parser


def main(argv: list[str]) -> int:
    """Run ``compare`` with ``argv`` (the arguments after ``compare``); returns the exit code."""
    try:
        args = build_parser().parse_args(argv)
        return compare(args)
    except SystemExit as done:  # --help
        return done.code if isinstance(done.code, int) else 0
    except UserInputError as exc:
        sys.stderr.write(f"error: {' '.join(str(exc).split())}\n")
        return 2


def compare(args: argparse.Namespace) -> int:
    """The command once its arguments are parsed: read, analyse, draw, write, publish."""
    client = connect(resolve_tracking_uri(args.tracking_uri))
    parent = find_parent(client, experiment=args.experiment, sweep_run_id=args.sweep)
    sweep = load_sweep(client, parent, args.metric)
    analysis = analyze(sweep, sweep.metric, args.baseline, args.confidence)
    if args.require_test:
        require_tests(analysis)
    out = Path(args.out) if args.out else Path("compare") / sweep.sweep_id[:8]
    out.mkdir(parents=True, exist_ok=True)
    figures = draw_all(analysis, out)
    markdown = render(analysis, figures)
    (out / REPORT_FILE).write_text(markdown)
    publish(client, sweep.parent_id, out, [REPORT_FILE, *figures])
    sys.stdout.write(markdown)
    sys.stderr.write(f"wrote {out / REPORT_FILE} and {len(figures)} figures; logged to run {sweep.parent_id} "
                     f"under {protocol.REPORT_DIR}/\n")
    return 0


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
