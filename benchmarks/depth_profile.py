"""The depth profile of the residual stream: pre-norm vs LayerNorm-Scaling vs Peri-LN vs nGPT, as a sweep.

The Curse-of-Depth picture on our data: the stream's RMS after every sublayer (``diag/stream_rms/*``, logged
by the diagnostics callback every 50 steps) against depth, at the start and at the end of training, for
models of one size (d=128, 8 layers, twice the recipe's depth so that growth with depth can show). Each
variant runs at the learning rate the ablation's tuning picked for it (``docs/ablation/report.md``): 3e-3 for
the RMSNorm family, 1e-2 for LNS and nGPT. ``cli.py compare`` draws the figure (``depth.png``).

    python -m benchmarks.depth_profile                # 8 runs of 300 steps x 16 x 64 tokens; ~10 min on 2 cores
    python -m benchmarks.depth_profile --report-only
"""

from __future__ import annotations

import argparse
import shlex

from benchmarks.ablation import REPO
from lit.commands import main as cli

STORE = f"sqlite:///{REPO / 'benchmarks' / 'out' / 'ablation.db'}"
EXPERIMENT = "depth-profile-tinyshakespeare"
VARIANTS = ["--variant=model.arch.norm=lns,model.lr=1e-2", "--variant=model.arch.norm=perinorm",
            f"--variant=config={REPO / 'recipes' / 'gpt_ngpt.yaml'},model.lr=1e-2"]
BUDGET = ["--model.arch.n_layers=8", "--model.diagnostics.interval=50", "--trainer.max_steps=300",
          "--data.batch_size=16", "--data.block_size=64", "--trainer.val_check_interval=50",
          "--trainer.limit_val_batches=16", "--trainer.num_sanity_val_steps=0"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--out", default=str(REPO / "docs" / "depth_profile"))
    args = parser.parse_args()
    sweep = ["--config", str(REPO / "recipes" / "gpt_baseline.yaml"), *VARIANTS, f"--seeds={args.seeds}",
             f"--experiment={EXPERIMENT}", f"--tracking_uri={STORE}", f"--parallel={args.parallel}",
             f"--out={REPO / 'benchmarks' / 'out' / EXPERIMENT}", *BUDGET]
    if not args.report_only:
        print("python cli.py sweep " + " ".join(shlex.quote(a) for a in sweep), flush=True)
        cli(["sweep", *sweep])
    cli(["compare", f"--experiment={EXPERIMENT}", f"--tracking_uri={STORE}", f"--out={args.out}"])


if __name__ == "__main__":
    main()
