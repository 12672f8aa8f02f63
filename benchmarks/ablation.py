"""Ablation on tinyshakespeare: the pre-RMSNorm baseline against each LAUREL variant and each norm strategy.

Every run is ``recipes/gpt_baseline.yaml`` launched through the CLI exactly as a user would, with one
component swapped (``--model.arch.norm=...`` or ``--model.arch.residual=...``, default options) and
everything else shared: model size (d=128, 4 layers, 4 heads, SwiGLU), optimizer and schedule (AdamW,
lr 3e-3, 50 warmup steps, cosine), seed, steps, batch and context. The baseline runs once more with
another seed, so the table shows how far apart two identical architectures land (seed noise); the
seed also fixes the data order only as long as two models draw the same number of random numbers at
init, which models with extra parameters do not.

All runs go to one MLflow experiment (``ablation-tinyshakespeare``) in a sqlite store under
``benchmarks/out/``; the script then reads the metrics back and writes

* ``benchmarks/out/ablation.md``: final val loss, its difference to the baseline, median train
  tokens/s, parameter count, run time (MLflow's start to end: training and validation);
* ``benchmarks/out/ablation_val_loss.png``: val-loss curves (residuals and norms in two panels);
* ``benchmarks/out/ablation.json``: the same numbers and curves.

Run from the repository root::

    pip install -e ".[bench]"                    # matplotlib for the plot
    python benchmarks/ablation.py                # 300 steps x 16 x 128 tokens per run, ~1 min each on 2 cores
    python benchmarks/ablation.py --quick        # 20 steps per run: checks the script end to end
    python benchmarks/ablation.py --only dyt lns --steps 500
    python benchmarks/ablation.py --report-only  # table and plot again from the runs stored in MLflow
    mlflow ui --backend-store-uri sqlite:///benchmarks/out/ablation.db
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "benchmarks" / "out"
RECIPE = REPO / "recipes" / "gpt_baseline.yaml"
EXPERIMENT = "ablation-tinyshakespeare"
BASE_SEED = 1337


@dataclass(frozen=True)
class Variant:
    label: str
    group: str  # "residual" or "norm": which panel of the plot, which baseline it swaps against
    arch: tuple[tuple[str, str], ...] = ()  # TransformerConfig fields that differ from the baseline recipe
    seed: int = BASE_SEED


BASELINE = Variant("baseline (rmsnorm, add)", "baseline")
VARIANTS = [
    BASELINE,
    *(Variant(name, "residual", (("residual", name),))
      for name in ("laurel_rw", "laurel_lr", "laurel_pa", "laurel_rw_lr", "laurel_rw_lr_pa")),
    *(Variant(name, "norm", (("norm", name),))
      for name in ("postnorm", "perinorm", "mixnorm", "lns", "dyt", "seednorm")),
    Variant("baseline, seed 1338", "baseline", seed=BASE_SEED + 1),
]


def cli_args(variant: Variant, args: argparse.Namespace, tracking_uri: str) -> list[str]:
    val_every = max(1, args.steps // args.val_points)
    return [
        sys.executable, str(REPO / "cli.py"), "fit", "--config", str(RECIPE),
        *(f"--model.arch.{key}={value}" for key, value in variant.arch),
        f"--seed_everything={variant.seed}",
        f"--trainer.max_steps={args.steps}",
        f"--data.batch_size={args.batch_size}",
        f"--data.block_size={args.block_size}",
        f"--trainer.val_check_interval={val_every}",
        f"--trainer.limit_val_batches={args.val_batches}",
        "--trainer.log_every_n_steps=5",
        "--trainer.num_sanity_val_steps=0",  # its batches are not logged: time spent for nothing here
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        f"--trainer.logger.init_args.experiment_name={EXPERIMENT}",
        f"--trainer.logger.init_args.tracking_uri={tracking_uri}",
        f"--trainer.logger.init_args.run_name={variant.label}",
        f"--trainer.logger.init_args.save_dir={OUT / 'runs'}",
    ]


def parameter_count(variant: Variant, block_size: int) -> int:
    """Parameters of the model the recipe builds (vocab 65), with the variant's swap."""
    import yaml

    from lit.models import GPT, TransformerConfig

    recipe = yaml.safe_load(RECIPE.read_text())
    arch = {**recipe["model"]["init_args"]["arch"], **dict(variant.arch)}
    model = GPT(65, block_size, TransformerConfig(**arch))
    return sum(p.numel() for p in model.parameters())


def read_run(client, experiment_id: str, label: str, since_ms: int) -> dict | None:
    """The latest finished run named ``label`` started after ``since_ms``, or None."""
    runs = client.search_runs([experiment_id], filter_string=f"attributes.run_name = '{label}' and "
                                                              f"attributes.start_time >= {since_ms} and "
                                                              f"attributes.status = 'FINISHED'",
                              order_by=["attributes.start_time DESC"], max_results=1)
    if not runs:
        return None
    run = runs[0]
    val = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "val/loss"))
    tps = [m.value for m in client.get_metric_history(run.info.run_id, "train/tokens_per_s")]
    params = run.data.params
    return dict(run_id=run.info.run_id, val_curve=val, final_val_loss=val[-1][1] if val else math.nan,
                tokens_per_s=statistics.median(tps) if tps else math.nan,
                run_s=(run.info.end_time - run.info.start_time) / 1000,
                setting=(params.get("trainer.max_steps"), params.get("data.init_args.batch_size"),
                         params.get("data.init_args.block_size"), params.get("trainer.limit_val_batches")))


def markdown(results: list[dict]) -> str:
    base = next(r for r in results if r["label"] == BASELINE.label)
    steps, batch, block, val_batches = base["setting"]
    lines = [
        f"{steps} steps x {batch} x {block} tokens, seed {BASE_SEED}, val loss on "
        f"{float(val_batches):.0f} batches of the held-out 10%.",
        "",
        "| variant | group | val loss | vs baseline | tokens/s | params | run s |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        delta = r["final_val_loss"] - base["final_val_loss"]
        lines.append(f"| {r['label']} | {r['group']} | {r['final_val_loss']:.4f} | "
                     f"{'' if r is base else f'{delta:+.4f}'} | {r['tokens_per_s']:,.0f} | {r['params']:,} | "
                     f"{r['run_s']:.0f} |")
    return "\n".join(lines) + "\n"


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 5), sharey=True)
    for ax, group, title in ((axes[0], "residual", "LAUREL residuals"), (axes[1], "norm", "norm strategies")):
        for r in results:
            if r["group"] not in (group, "baseline") or not r["val_curve"]:
                continue
            steps, losses = zip(*r["val_curve"], strict=True)
            style = dict(color="black", linewidth=2.2) if r["label"] == BASELINE.label else (
                dict(color="gray", linestyle="--") if r["group"] == "baseline" else {})
            ax.plot(steps, losses, marker=".", label=r["label"], **style)
        ax.set_title(title)
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("val loss (nats per character)")
    # The first validation is far above the rest; start the axis where the runs can be told apart.
    tail = [loss for r in results for _, loss in r["val_curve"][1:]]
    if tail:
        axes[0].set_ylim(min(tail) - 0.02, max(tail) + 0.02)
    fig.suptitle("tinyshakespeare, d=128, 4 layers: one component swapped against pre-RMSNorm + add")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps per run")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--block-size", type=int, default=128, help="context length (tokens per sequence)")
    parser.add_argument("--val-points", type=int, default=5, help="validations per run (points on each curve)")
    parser.add_argument("--val-batches", type=int, default=8, help="validation batches per validation")
    parser.add_argument("--quick", action="store_true", help="20 steps per run, 2 validations: a smoke test")
    parser.add_argument("--only", nargs="+", metavar="LABEL", help="run only these variants (baseline is always run)")
    parser.add_argument("--report-only", action="store_true",
                        help="train nothing: rebuild the table and plot from the latest finished run of each variant")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.val_points, args.val_batches = 20, 2, 2
    variants = [v for v in VARIANTS if args.only is None or v is BASELINE or v.label in args.only]
    unknown = set(args.only or ()) - {v.label for v in VARIANTS}
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}; choose from {[v.label for v in VARIANTS]}")

    import mlflow

    OUT.mkdir(parents=True, exist_ok=True)
    tracking_uri = f"sqlite:///{OUT / 'ablation.db'}"
    since_ms = 0 if args.report_only else int(time.time() * 1000)
    for variant in [] if args.report_only else variants:
        print(f"== {variant.label}", flush=True)
        subprocess.run(cli_args(variant, args, tracking_uri), cwd=REPO, check=True)

    client = mlflow.MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    if experiment is None:
        sys.exit(f"no experiment {EXPERIMENT!r} in {tracking_uri}: run the ablation first")
    results = []
    for variant in variants:
        run = read_run(client, experiment.experiment_id, variant.label, since_ms)
        if run is None:
            print(f"note: no finished run of {variant.label!r}; left out of the table", file=sys.stderr)
            continue
        results.append(dict(label=variant.label, group=variant.group, arch=dict(variant.arch), seed=variant.seed,
                            params=parameter_count(variant, int(run["setting"][2])), **run))
    if not any(r["label"] == BASELINE.label for r in results):
        sys.exit("the baseline has no finished run: nothing to compare against")

    table = markdown(results)
    (OUT / "ablation.md").write_text(table)
    (OUT / "ablation.json").write_text(json.dumps(dict(vars(args), results=results), indent=1))
    plot(results, OUT / "ablation_val_loss.png")
    print(table)
    print(f"wrote {OUT / 'ablation.md'}, {OUT / 'ablation_val_loss.png'}, {OUT / 'ablation.json'}")


if __name__ == "__main__":
    main()
