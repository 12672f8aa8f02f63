"""The reproduction report: does each method's claimed direction hold here, with seeds, tuned learning rates
and intervals? A preset of ``cli.py sweep`` and ``cli.py compare`` plus one table, one row per claim.

Two sweeps, each method as its own recipe (its authors' init, weight decay, clipping and final norm: see
docs/reproduction.md and ../shared/specs/fidelity-audit.md):

- text: tinyshakespeare (char level), every seed method against the pre-RMSNorm baseline at 8 layers (twice
  the quickstart recipe's depth, so that depth-related claims have room to show), 300 steps x 16 x 64 tokens,
  ``model.lr`` tuned per variant over 2e-3, 6e-3, 2e-2 on the first seed, 3 paired seeds;
- images: the embedded digits (ViT, 4 layers, 30 epochs), the image claims (DyT vs LayerNorm, nGPT,
  TokenFormer) against the LayerNorm ViT, ``model.lr`` tuned over 1e-3, 3e-3, 1e-2, 5 paired seeds.

Run from the repository root::

    python -m benchmarks.reproduction                  # both sweeps, then the reports (about 75 min on 2 cores)
    python -m benchmarks.reproduction --only digits    # one of them
    python -m benchmarks.reproduction --report-only    # the reports and the claims table from the stored runs
    mlflow ui --backend-store-uri sqlite:///benchmarks/out/reproduction.db

Writes docs/reproduction/{text,digits}/report.md (``cli.py compare``) and docs/reproduction/claims.md (the
table). Each sweep's command is printed first, so the preset also documents the sweeps.
"""

from __future__ import annotations

import argparse
import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from lit.cli import main as cli

REPO = Path(__file__).resolve().parents[1]
STORE = "sqlite:///benchmarks/out/reproduction.db"
OUT = Path("docs") / "reproduction"


@dataclass(frozen=True)
class Suite:
    """One sweep: a recipe, its variants and its budget."""

    name: str
    experiment: str
    recipe: str
    variants: tuple[str, ...]
    learning_rates: str
    seeds: int
    budget: tuple[str, ...]
    metric: str


TEXT_RECIPES = ("gpt_dyt", "gpt_perinorm", "gpt_mixnorm", "gpt_lns", "gpt_seednorm", "gpt_postnorm",
                "gpt_laurel_rw", "gpt_laurel_lr", "gpt_laurel_rw_lr_pa", "gpt_ngpt", "gpt_tokenformer")
SUITES = {
    "text": Suite(
        name="text",
        experiment="reproduction-tinyshakespeare",
        recipe="recipes/gpt_baseline.yaml",
        # LayerNorm on the baseline recipe: the reference of the DyT claim (the baseline itself is RMSNorm).
        variants=("model.arch.norm=layernorm", *(f"config=recipes/{name}.yaml" for name in TEXT_RECIPES)),
        learning_rates="2e-3,6e-3,2e-2",
        seeds=3,
        budget=("--model.arch.n_layers=8", "--trainer.max_steps=300", "--data.batch_size=16",
                "--data.block_size=64", "--trainer.val_check_interval=50", "--trainer.limit_val_batches=16",
                "--trainer.log_every_n_steps=10", "--trainer.num_sanity_val_steps=0"),
        metric="val/loss",
    ),
    "digits": Suite(
        name="digits",
        experiment="reproduction-digits",
        recipe="recipes/vit_digits.yaml",
        variants=("config=recipes/vit_dyt.yaml", "config=recipes/vit_ngpt.yaml",
                  "config=recipes/vit_tokenformer_digits.yaml"),
        learning_rates="1e-3,3e-3,1e-2",
        seeds=5,
        budget=("--trainer.num_sanity_val_steps=0",),
        metric="val/acc1",
    ),
}


def sweep_args(suite: Suite, parallel: int) -> list[str]:
    return ["--config", suite.recipe, *(f"--variant={v}" for v in suite.variants), f"--seeds={suite.seeds}",
            f"--tune=model.lr={suite.learning_rates}", f"--experiment={suite.experiment}",
            f"--tracking_uri={STORE}", f"--parallel={parallel}", f"--out={Path('benchmarks') / 'out' / suite.name}",
            *suite.budget]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(SUITES), help="run one sweep (default: both)")
    parser.add_argument("--parallel", type=int, default=2, help="runs at once (default 2: one per core)")
    parser.add_argument("--report-only", action="store_true", help="train nothing; write the reports again")
    args = parser.parse_args()
    os.chdir(REPO)  # the recipes are named relative to the repository, as a user types them
    suites = [SUITES[args.only]] if args.only else list(SUITES.values())
    for suite in suites:
        if not args.report_only:
            sweep = sweep_args(suite, args.parallel)
            print("python cli.py sweep " + " ".join(shlex.quote(a) for a in sweep), flush=True)
            cli(["sweep", *sweep])
        cli(["compare", f"--experiment={suite.experiment}", f"--tracking_uri={STORE}", f"--metric={suite.metric}",
             f"--out={OUT / suite.name}"])


if __name__ == "__main__":
    main()
