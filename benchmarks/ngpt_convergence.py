"""Convergence on tinyshakespeare: the GPT baseline against nGPT at equal steps, from the shipped recipes.

Trains ``recipes/gpt_baseline.yaml`` and ``recipes/gpt_ngpt.yaml`` through the CLI exactly as a user would
(same data, seed, batch, size and LR; the nGPT recipe differs only where the paper says: no weight decay,
no warmup, init std 1/sqrt(d)), with validation every ``--val_every`` steps, and reports:

* the validation loss curves (CSV from Lightning's CSVLogger, a PNG plot, a JSON summary);
* the steps each model needs to reach the baseline's final validation loss (linear interpolation
  between evaluations; "not reached" if nGPT never gets there).

Run from the repository root (matplotlib is in the bench extra)::

    python benchmarks/ngpt_convergence.py                                  # the recipes as shipped: 500 steps
    python benchmarks/ngpt_convergence.py --max_steps 300 --val_every 25   # shorter

Outputs go to ``--out`` (default benchmarks/results/): ngpt_convergence.png and ngpt_convergence.json.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lit.cli import main as cli_main  # noqa: E402

RECIPES = {"GPT baseline (rmsnorm / add)": "recipes/gpt_baseline.yaml",
           "nGPT (hypersphere / ngpt)": "recipes/gpt_ngpt.yaml"}


def train(recipe: str, args: argparse.Namespace, workdir: Path) -> tuple[list[tuple[int, float]], float]:
    """Run one recipe; returns [(optimizer step, val loss)] and the wall time in seconds."""
    logs = workdir / Path(recipe).stem
    start = time.perf_counter()
    cli_main(["fit", "--config", str(REPO / recipe), f"--trainer.max_steps={args.max_steps}",
              f"--trainer.val_check_interval={args.val_every}", f"--trainer.limit_val_batches={args.val_batches}",
              "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
              "--trainer.logger=lightning.pytorch.loggers.CSVLogger", f"--trainer.logger.init_args.save_dir={logs}",
              f"--checkpoint.dirpath={logs / 'checkpoints'}"])
    wall = time.perf_counter() - start
    (metrics,) = logs.rglob("metrics.csv")
    with open(metrics) as f:
        # The step column is 0-based: validation after N optimizer steps is logged at N - 1.
        curve = [(int(row["step"]) + 1, float(row["val/loss"])) for row in csv.DictReader(f) if row.get("val/loss")]
    return curve, wall


def steps_to_reach(curve: list[tuple[int, float]], target: float) -> float | None:
    """First step at which the curve reaches ``target``, interpolating linearly between evaluations."""
    prev = None
    for step, loss in curve:
        if loss <= target:
            if prev is None or prev[1] == loss:
                return float(step)
            (s0, l0) = prev
            return s0 + (l0 - target) / (l0 - loss) * (step - s0)
        prev = (step, loss)
    return None


def plot(curves: dict[str, list[tuple[int, float]]], target: float, path: Path, title: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print('note: matplotlib is not installed; no plot (pip install -e ".[bench]")')
        return False
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, curve in curves.items():
        ax.plot([s for s, _ in curve], [v for _, v in curve], marker="o", markersize=3, label=name)
    ax.axhline(target, color="gray", linestyle=":", linewidth=1, label=f"baseline final val loss {target:.3f}")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("validation loss (nats / char)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--max_steps", type=int, default=500)
    p.add_argument("--val_every", type=int, default=50, help="optimizer steps between validations")
    p.add_argument("--val_batches", type=int, default=16, help="validation batches of 32 x 128 chars")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    sys.argv = sys.argv[:1]  # LightningCLI reads sys.argv too; the recipe arguments are passed explicitly

    curves, walls = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, recipe in RECIPES.items():
            curves[name], walls[name] = train(recipe, args, Path(tmp))
            print(f"{name}: {len(curves[name])} evaluations, final val loss {curves[name][-1][1]:.4f}, "
                  f"{walls[name]:.0f} s", flush=True)

    baseline, ngpt = curves.values()
    target = baseline[-1][1]
    reach = {name: steps_to_reach(curve, target) for name, curve in curves.items()}
    summary = {
        "config": vars(args),
        "val_loss": {name: curve for name, curve in curves.items()},
        "baseline_final_val_loss": target,
        "steps_to_baseline_final": reach,
        "wall_s": walls,
    }
    ngpt_name = list(RECIPES)[1]
    if reach[ngpt_name]:
        summary["speedup_in_steps"] = reach[list(RECIPES)[0]] / reach[ngpt_name]
    title = (f"tinyshakespeare char-level, d=128 L=4, batch 32x128, {args.max_steps} steps,\n"
             f"validation every {args.val_every} steps ({args.val_batches} batches)")
    if plot(curves, target, out / "ngpt_convergence.png", title):
        summary["plot"] = str(out / "ngpt_convergence.png")
    (out / "ngpt_convergence.json").write_text(json.dumps(summary, indent=2))

    print("\n| model | final val loss | steps to reach the baseline's final val loss | wall (s) |")
    print("|---|---:|---:|---:|")
    for name, curve in curves.items():
        r = reach[name]
        print(f"| {name} | {curve[-1][1]:.4f} | {'not reached' if r is None else f'{r:.0f}'} | {walls[name]:.0f} |")
    if "speedup_in_steps" in summary:
        print(f"\nnGPT reaches the baseline's final val loss in {summary['speedup_in_steps']:.2f}x fewer steps")
    return summary


if __name__ == "__main__":
    main()
