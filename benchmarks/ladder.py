"""The scaling report: the baseline and the reproduction report's leads up a ladder of four sizes, each with its
effective-compute multiplier and interval. A preset of ``cli.py sweep --ladder`` and ``cli.py compare --scaling``.

The ladder is sized for this project's 2-core CPU machine: tinyshakespeare (char level), 2 layers, 2 heads,
widths 24, 32, 48 and 64 (about 36x compute from the smallest rung to the largest), 10 training tokens per
non-embedding parameter of the baseline (every variant trains on the same tokens at a rung), 32 x 128 tokens per
step, warm-up over the first 10% of each rung's steps, the recipe's learning rate at every rung (no
parametrization transfers it yet: stated in the report) with the lr/2 and 2 lr check of the baseline on the first
seed, 3 paired
seeds. Run from the repository root::

    python -m benchmarks.ladder                 # the sweep (resumes), then the report
    python -m benchmarks.ladder --report-only   # the report from the stored runs
    python -m benchmarks.ladder --variants gpt_perinorm gpt_postnorm --seeds 3   # a reduced ladder
    mlflow ui --backend-store-uri sqlite:///benchmarks/out/ladder.db

Writes docs/scale/ladder/ (``compare --scaling``'s report.md and figures). The commands are printed first, so
the preset also documents them.
"""

from __future__ import annotations

import argparse
import os
import shlex
import time

from lit.commands import main as cli

STORE = "sqlite:///benchmarks/out/ladder.db"
EXPERIMENT = "scaling-ladder"
OUT = "docs/scale/ladder"
RECIPE = "recipes/gpt_baseline.yaml"
LEADS = ("gpt_perinorm", "gpt_postnorm", "gpt_attnres_block", "gpt_hyperconn")
RUNGS = ";".join(f"d_model={d},n_layers=2,n_heads=2" for d in (24, 32, 48, 64))
TOKENS_PER_PARAM = "10"


def sweep_command(variants: list[str], seeds: int, parallel: int) -> list[str]:
    command = ["sweep", "--config", RECIPE, "--ladder", RUNGS, "--tokens_per_param", TOKENS_PER_PARAM,
               "--ladder_lr", "fixed", "--ladder_lr_check", "baseline", "--seeds", str(seeds),
               "--experiment", EXPERIMENT, "--tracking_uri", STORE, "--parallel", str(parallel),
               "--trainer.log_every_n_steps=10"]
    for name in variants:
        command += ["--variant", f"config=recipes/{name}.yaml"]
    return command


def report_command() -> list[str]:
    return ["compare", "--scaling", "--experiment", EXPERIMENT, "--tracking_uri", STORE, "--out", OUT]


def run(command: list[str]) -> int:
    print("$ python cli.py " + shlex.join(command), flush=True)
    return cli(command)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ladder", description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="+", default=list(LEADS), help="recipes (names under recipes/) "
                        f"run beside the baseline (default: {' '.join(LEADS)})")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--report-only", action="store_true", help="report the stored runs; train nothing")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.makedirs("benchmarks/out", exist_ok=True)
    started = time.time()
    if not args.report_only:
        code = run(sweep_command(args.variants, args.seeds, args.parallel))
        if code != 0:
            return code
        print(f"ladder sweep: {time.time() - started:.0f} s wall", flush=True)
    return run(report_command())


if __name__ == "__main__":
    raise SystemExit(main())
