"""The ablation on tinyshakespeare, as a preset of ``cli.py sweep`` and ``cli.py compare``.

Every built-in norm strategy and residual type swapped, one at a time, into ``recipes/gpt_baseline.yaml``
(pre-RMSNorm, plain residual), plus nGPT as its own recipe (hypersphere norm and nGPT residual come as a
pair, with the paper's optimizer settings). Each variant gets its own learning rate (tuned over 1e-3, 3e-3,
1e-2 on the first seed at the full budget) and three paired seeds. The report (statistics, curves) is
written by ``cli.py compare`` to ``docs/ablation/`` and logged into the sweep's parent run.

Run from the repository root::

    python -m benchmarks.ablation                 # 75 runs of 300 steps x 16 x 64 tokens; 45 min on 2 shared cores
    python -m benchmarks.ablation --quick         # 2 variants, 2 seeds, 10 steps: checks the pipeline
    python -m benchmarks.ablation --report-only   # the report again from the runs in the store
    mlflow ui --backend-store-uri sqlite:///benchmarks/out/ablation.db

The command it runs is printed first, so the preset is also the documentation of the sweep.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from lit.commands import main as cli

REPO = Path(__file__).resolve().parents[1]
NORMS = ("layernorm", "layernorm_nonparam", "postnorm", "perinorm", "mixnorm", "lns", "dyt", "seednorm")
RESIDUALS = ("laurel_rw", "laurel_lr", "laurel_pa", "laurel_rw_lr", "laurel_rw_lr_pa")
LEARNING_RATES = "1e-3,3e-3,1e-2"
BUDGET = ["--trainer.max_steps=300", "--data.batch_size=16", "--data.block_size=64",
          "--trainer.val_check_interval=50", "--trainer.limit_val_batches=16", "--trainer.log_every_n_steps=10",
          "--trainer.num_sanity_val_steps=0"]


def sweep_args(args: argparse.Namespace) -> list[str]:
    store = f"sqlite:///{REPO / 'benchmarks' / 'out' / 'ablation.db'}"
    if args.quick:
        variants = ["--variant=model.arch.norm=layernorm"]
        budget = ["--trainer.max_steps=10", "--data.batch_size=8", "--data.block_size=32",
                  "--trainer.val_check_interval=5", "--trainer.limit_val_batches=2", "--trainer.num_sanity_val_steps=0"]
        seeds, tune, experiment = 2, "1e-3,3e-3", "ablation-quick"
    else:
        variants = [f"--variant=model.arch.norm={n}" for n in NORMS]
        variants += [f"--variant=model.arch.residual={r}" for r in RESIDUALS]
        variants += [f"--variant=config={REPO / 'recipes' / 'gpt_ngpt.yaml'}"]
        budget, seeds, tune, experiment = BUDGET, args.seeds, LEARNING_RATES, "ablation-tinyshakespeare"
    return ["--config", str(REPO / "recipes" / "gpt_baseline.yaml"), *variants, f"--seeds={seeds}",
            f"--tune=model.lr={tune}", f"--experiment={experiment}", f"--tracking_uri={store}",
            f"--parallel={args.parallel}", f"--out={REPO / 'benchmarks' / 'out' / experiment}", *budget]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--parallel", type=int, default=2, help="runs at once (default 2: one per core)")
    parser.add_argument("--quick", action="store_true", help="a tiny sweep that checks the pipeline end to end")
    parser.add_argument("--report-only", action="store_true", help="train nothing; write the report again")
    parser.add_argument("--out", default=str(REPO / "docs" / "ablation"), help="where the report goes")
    args = parser.parse_args()
    sweep = sweep_args(args)
    if not args.report_only:
        print("python cli.py sweep " + " ".join(shlex.quote(a) for a in sweep), flush=True)
        cli(["sweep", *sweep])
    experiment = next(a.split("=", 1)[1] for a in sweep if a.startswith("--experiment="))
    store = next(a.split("=", 1)[1] for a in sweep if a.startswith("--tracking_uri="))
    out = args.out if not args.quick else str(REPO / "benchmarks" / "out" / "ablation-quick-report")
    try:
        cli(["compare", f"--experiment={experiment}", f"--tracking_uri={store}", f"--out={out}"])
    except ModuleNotFoundError as exc:  # compare not installed in this checkout
        sys.exit(f"error: {exc}")


if __name__ == "__main__":
    main()
