"""The reproduction report: does each method's claimed direction hold here, with seeds, tuned learning rates
and intervals? A preset of ``cli.py sweep`` and ``cli.py compare`` plus one table, one row per claim.

Three sweeps, each method as its own recipe (its authors' init, weight decay, clipping and final norm: see
docs/reproduction.md):

- text: tinyshakespeare (char level), every seed method against the pre-RMSNorm baseline at 8 layers (twice
  the quickstart recipe's depth, so that depth-related claims have room to show), 300 steps x 16 x 64 tokens,
  ``model.lr`` tuned per variant over 2e-3, 6e-3, 2e-2 on the first seed, 3 paired seeds;
- zoo: this round's components (AttnRes, hyper-connections, BHyT, Pre-CRMSNorm, PRepBN) at the ablation's
  4-layer size, ``model.lr`` tuned over 1e-3, 3e-3, 1e-2, 3 paired seeds;
- images: the embedded digits (ViT, 4 layers, 30 epochs), the image claims (DyT vs LayerNorm, nGPT,
  TokenFormer) against the LayerNorm ViT, ``model.lr`` tuned over 1e-3, 3e-3, 1e-2, 5 paired seeds.

Run from the repository root::

    python -m benchmarks.reproduction                  # all three sweeps, then the reports (about 90 min on 2 cores)
    python -m benchmarks.reproduction --only digits    # one of them
    python -m benchmarks.reproduction --report-only    # the reports and the claims table from the stored runs
    mlflow ui --backend-store-uri sqlite:///benchmarks/out/reproduction.db

Writes docs/reproduction/{text,zoo,digits}/report.md (``cli.py compare``) and docs/reproduction/claims.md (the
table). Each sweep's command is printed first, so the preset also documents the sweeps.
"""

from __future__ import annotations

import argparse
import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from lit.commands import main as cli
from lit.compare import stats
from lit.compare.analysis import Analysis, analyze
from lit.compare.runs import connect, find_parent, load_sweep
from lit.errors import UserInputError

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
ZOO_RECIPES = ("attnres", "attnres_block", "hyperconn", "bhyt", "precrmsnorm", "prepbn")
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
    "zoo": Suite(  # this round's components, at the 4-layer size of the ablation (the CPU budget left for them)
        name="zoo",
        experiment="reproduction-zoo",
        recipe="recipes/gpt_baseline.yaml",
        variants=tuple(f"config=recipes/gpt_{name}.yaml" for name in ZOO_RECIPES),
        learning_rates="1e-3,3e-3,1e-2",
        seeds=3,
        budget=("--trainer.max_steps=300", "--data.batch_size=16", "--data.block_size=64",
                "--trainer.val_check_interval=50", "--trainer.limit_val_batches=16",
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


@dataclass(frozen=True)
class Claim:
    """A paper's claim about a method, as a paired comparison of two variants of one suite.

    ``expect``: "better" (the method beats the reference), "parity" (it matches it) or "worse"."""

    suite: str
    method: str
    variant: str  # the label cli.py compare gives the variant
    reference: str
    paper: str  # the claim and its number, as the paper (or its code) reports it
    expect: str


BASELINE = "recipe"  # the label of the unchanged recipe in a sweep
CLAIMS = (
    Claim("text", "nGPT", "config=gpt_ngpt", BASELINE, "reaches GPT's loss in about 4x fewer tokens at 1k context "
          "(0.5B/1B, OpenWebText; Fig. 2)", "better"),
    Claim("text", "LAUREL-RW", "config=gpt_laurel_rw", BASELINE, "C4 test loss 3.0159 -> 2.9557 (24 layers, 157M)",
          "better"),
    Claim("text", "LAUREL-LR", "config=gpt_laurel_lr", BASELINE, "3.0159 -> 2.9624 (same model)", "better"),
    Claim("text", "LAUREL-RW+LR+PA", "config=gpt_laurel_rw_lr_pa", BASELINE, "3.0159 -> 2.9499 (same model)",
          "better"),
    Claim("text", "DyT vs LayerNorm (LM)", "config=gpt_dyt", "norm=layernorm", "matches LayerNorm in LLaMA "
          "pre-training (7B-70B); third parties find it worse than RMSNorm in GPT-2-size runs", "parity"),
    Claim("text", "Peri-LN", "config=gpt_perinorm", BASELINE, "5-task average 49.69 -> 51.57 over Pre-LN (400M, "
          "30B tokens)", "better"),
    Claim("text", "Mix-LN", "config=gpt_mixnorm", BASELINE, "perplexity 26.73 -> 26.07 over Pre-LN (LLaMA-130M; "
          "diverged at 350M and 1B in the LNS paper)", "better"),
    Claim("text", "LayerNorm-Scaling", "config=gpt_lns", BASELINE, "perplexity 26.73 -> 25.76 over Pre-LN "
          "(LLaMA-130M), 17.02 -> 15.71 at 1B", "better"),
    Claim("text", "SeeDNorm", "config=gpt_seednorm", BASELINE, "OLMo2-1B loss 2.884 -> 2.879, OLMoE-1.3B 2.922 -> "
          "2.900 over RMSNorm", "better"),
    Claim("text", "Post-LN", "config=gpt_postnorm", BASELINE, "worse than Pre-LN: perplexity 26.95 vs 26.73 "
          "(LLaMA-130M), diverges from 250M", "worse"),
    Claim("text", "TokenFormer", "config=gpt_tokenformer", BASELINE, "matches or beats a Transformer of the same "
          "size (TokenFormer-150M zero-shot average 44.7 vs Pythia-160M 40.1)", "parity"),
    Claim("zoo", "Attention Residuals (full)", "config=gpt_attnres", BASELINE, "val loss 1.766 (PreNorm) -> 1.737 "
          "(16-head ablation model)", "better"),
    Claim("zoo", "Attention Residuals (block)", "config=gpt_attnres_block", BASELINE, "1.766 -> 1.746 (block size 4, "
          "same ablation)", "better"),
    Claim("zoo", "Hyper-connections (dynamic, n=4)", "config=gpt_hyperconn", BASELINE, "lower loss than the plain "
          "residual at OLMo-1B and OLMoE scale", "better"),
    Claim("zoo", "BHyT", "config=gpt_bhyt", BASELINE, "Llama-1B C4 perplexity 17.75 (RMSNorm) -> 16.47", "better"),
    Claim("zoo", "Pre-CRMSNorm", "config=gpt_precrmsnorm", BASELINE, "the same function as Pre-LN, 1-10% faster "
          "(quality: parity with Pre-LN, which ties RMSNorm here)", "parity"),
    Claim("zoo", "PRepBN (SLAB)", "config=gpt_prepbn", BASELINE, "matches LayerNorm's quality with a BatchNorm that "
          "folds away at inference (LLaMA-350M, DeiT, Swin)", "parity"),
    Claim("digits", "DyT vs LayerNorm (ViT)", "config=vit_dyt", BASELINE, "ImageNet ViT-B top-1 82.3 -> 82.5",
          "parity"),
    Claim("digits", "nGPT (ViT)", "config=vit_ngpt", BASELINE, "no image result in the paper; its claim is faster "
          "convergence at equal quality", "parity"),
    Claim("digits", "TokenFormer (ViT)", "config=vit_tokenformer_digits", BASELINE, "ImageNet TokenFormer-B/16 82.5 "
          "(109M) vs ViT-B/16 82.3 (86M)", "parity"),
)
# (expected, measured) -> the row's verdict. A parity claim is never "reproduced" by a test that finds nothing:
# that would need an equivalence margin the papers do not give, so it stays "not distinguishable".
VERDICTS = {
    ("better", stats.BETTER): "direction reproduced",
    ("better", stats.WORSE): "not reproduced (worse)",
    ("better", stats.UNRESOLVED): "not distinguishable at this scale",
    ("parity", stats.UNRESOLVED): "not distinguishable at this scale",
    ("parity", stats.BETTER): "better than parity",
    ("parity", stats.WORSE): "not reproduced (worse)",
    ("worse", stats.WORSE): "direction reproduced",
    ("worse", stats.BETTER): "not reproduced (better)",
    ("worse", stats.UNRESOLVED): "not distinguishable at this scale",
}


def claims_table(analyses: dict[str, Analysis], confidence: float = 0.95) -> str:
    """One row per claim: the paper's number, our paired difference with its interval, a Holm-adjusted paired
    t-test over all the rows, and the verdict in the claim's own terms."""
    rows, tests = [], []
    for claim in CLAIMS:
        analysis = analyses.get(claim.suite)
        values = {v.label: v for v in analysis.variants} if analysis else {}
        if claim.variant not in values or claim.reference not in values:
            continue
        paired = stats.paired_difference(values[claim.variant].values, values[claim.reference].values, confidence)
        rows.append((claim, analysis, values[claim.variant], paired))
        if paired.p_value is not None:
            tests.append(paired.p_value)
    adjusted = iter(stats.holm(tests))
    lines = ["| method | paper's claim | reference here | metric | ours (mean over seeds) | paired difference "
             "[95% CI] | p (Holm) | verdict |", "|---|---|---|---|---|---|---|---|"]
    for claim, analysis, variant, paired in rows:
        p = next(adjusted) if paired.p_value is not None else None
        measured = stats.verdict(paired.summary.mean, p, 1 - confidence, analysis.mode) if p is not None else None
        verdict = VERDICTS[(claim.expect, measured)] if measured else "needs >= 2 paired seeds"
        interval = paired.summary.interval if paired.summary else None
        if measured == stats.UNRESOLVED and interval and (interval[0] > 0 or interval[1] < 0):
            lead = stats.improvement(paired.summary.mean, analysis.mode) > 0
            verdict += f" (a lead: {'better' if lead else 'worse'} before the Holm correction)"
        ci = f"[{interval[0]:+.3f}, {interval[1]:+.3f}]" if interval else "n/a"
        ours = f"{variant.summary.mean:.3f} ± {variant.summary.std or 0:.3f} (n={variant.summary.n})"
        reference = "pre-RMSNorm baseline" if claim.reference == BASELINE and claim.suite != "digits" else (
            "LayerNorm ViT" if claim.reference == BASELINE else claim.reference)
        lines.append(f"| {claim.method} | {claim.paper} | {reference} | {analysis.metric} | {ours} | "
                     f"{paired.summary.mean:+.3f} {ci} | {'n/a' if p is None else f'{p:.3g}'} | {verdict} |")
    return "\n".join(lines) + "\n"


def sweep_args(suite: Suite, parallel: int) -> list[str]:
    return ["--config", suite.recipe, *(f"--variant={v}" for v in suite.variants), f"--seeds={suite.seeds}",
            f"--tune=model.lr={suite.learning_rates}", f"--experiment={suite.experiment}",
            f"--tracking_uri={STORE}", f"--parallel={parallel}", f"--out={Path('benchmarks') / 'out' / suite.name}",
            *suite.budget]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(SUITES), help="run one sweep (default: all)")
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
    client = connect(STORE)
    analyses = {}
    for suite in SUITES.values():
        try:
            parent = find_parent(client, experiment=suite.experiment)
        except UserInputError as exc:  # a suite not run yet: its rows are left out of the table
            print(f"{suite.name}: no sweep in {STORE} ({' '.join(str(exc).split())}); its claims are left out")
            continue
        analyses[suite.name] = analyze(load_sweep(client, parent, suite.metric), suite.metric, None, 0.95)
    (OUT / "claims.md").write_text(claims_table(analyses))
    print((OUT / "claims.md").read_text())


if __name__ == "__main__":
    main()
