"""Learning-rate transfer across width, measured: does the best learning rate move as the model widens?

For each parametrization (``mup`` from recipes/gpt_mup.yaml, and the same recipe under ``sp``) one
``cli.py sweep`` trains a grid of widths x learning rates (a factor-2 grid) over paired seeds, and
``cli.py compare`` reports it. This script then reads the final validation loss of every run back from MLflow and
gives, per width, the best learning rate with a bootstrap interval over seeds (the argmin of a parabola fitted in
log2(lr) around the grid's best point, on seed-resampled means), and the regret of the base width's optimum
transferred as is (its loss minus that width's best, against the seed noise). Writes a figure and a JSON.

    OMP_NUM_THREADS=1 nice -n 10 python -m benchmarks.lr_transfer            # the docs' figure
    python -m benchmarks.lr_transfer --analyse                                # redraw from the MLflow store
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "gpt_mup.yaml"
OUT = REPO / "benchmarks" / "out" / "lr_transfer"  # the MLflow store and the sweeps' folders (not tracked)
FIGURE = REPO / "docs" / "scale" / "lr_transfer.png"  # and the numbers beside it, as .json
PARAMETRIZATIONS = ("mup", "sp")
METRIC = "val/loss"
# Short runs: 2 CPU cores shared by several people (docs/scale/lr_transfer.md states the budget).
FIT_OPTIONS = ["--trainer.max_steps=120", "--trainer.val_check_interval=120", "--trainer.limit_val_batches=4",
               "--data.batch_size=8", "--model.diagnostics.interval=0", "--trainer.enable_progress_bar=false"]


def recipe_for(parametrization: str, out: Path) -> Path:
    """The muP recipe, or the same recipe under standard parametrization (no base shape, no readout option)."""
    if parametrization == "mup":
        return RECIPE
    config = yaml.safe_load(RECIPE.read_text())
    arch = config["model"]["init_args"]["arch"]
    arch["parametrization"], arch["parametrization_options"] = parametrization, {}
    path = out / f"gpt_{parametrization}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def run_sweeps(a: argparse.Namespace, uri: str) -> None:
    for p in a.parametrizations:
        command = [sys.executable, str(REPO / "cli.py"), "sweep", "--config", str(recipe_for(p, a.out)),
                   "--vary", f"model.arch.d_model={','.join(map(str, a.widths))}",
                   "--vary", f"model.lr={','.join(map(repr, a.lrs))}", "--seeds", str(a.seeds),
                   "--metric", METRIC, "--experiment", f"lr-transfer-{p}", "--tracking_uri", uri,
                   "--parallel", str(a.parallel), "--out", str(a.out / f"sweep-{p}"), *FIT_OPTIONS]
        subprocess.run(command, check=True, cwd=a.out)
        subprocess.run([sys.executable, str(REPO / "cli.py"), "compare", "--experiment", f"lr-transfer-{p}",
                        "--tracking_uri", uri, "--out", str(a.out / f"compare-{p}")], check=False, cwd=a.out)


def read_losses(uri: str, parametrization: str) -> dict[tuple[int, float], dict[str, float]]:
    """{(width, lr): {seed: final val loss}} of the newest sweep of that parametrization (diverged: inf)."""
    from lit.compare.runs import connect, find_parent, load_sweep

    client = connect(uri)
    sweep = load_sweep(client, find_parent(client, f"lr-transfer-{parametrization}"))
    losses: dict[tuple[int, float], dict[str, float]] = {}
    for row in sweep.runs.itertuples():
        values = dict(part.split("=", 1) for part in row.variant.split(","))
        key = (int(values["d_model"]), float(values["lr"]))
        final = client.get_run(row.run_id).data.metrics.get(METRIC) if row.outcome == "finished" else None
        losses.setdefault(key, {})[row.seed] = final if final is not None and math.isfinite(final) else math.inf
    return losses


def optimum(lrs: list[float], means: np.ndarray) -> float:
    """log2 of the best lr: the vertex of a parabola through the grid's best point and its neighbours (the
    grid point itself at an edge or when the three points do not curve up)."""
    x = np.log2(lrs)
    i = int(np.argmin(means))
    if i == 0 or i == len(lrs) - 1 or not np.all(np.isfinite(means[i - 1:i + 2])):
        return float(x[i])
    a, b, _ = np.polyfit(x[i - 1:i + 2], means[i - 1:i + 2], 2)
    return float(np.clip(-b / (2 * a), x[i - 1], x[i + 1])) if a > 0 else float(x[i])


def analyse(losses: dict[tuple[int, float], dict[str, float]], widths: list[int], lrs: list[float],
            rng: np.random.Generator, resamples: int = 2000) -> dict:
    seeds = sorted({s for per_seed in losses.values() for s in per_seed})
    table = np.full((len(widths), len(lrs), len(seeds)), np.nan)
    for (w, lr), per_seed in losses.items():
        if w in widths and lr in lrs:
            for s, v in per_seed.items():
                table[widths.index(w), lrs.index(lr), seeds.index(s)] = v
    result = {"widths": widths, "lrs": lrs, "seeds": seeds, "per_width": []}
    base_best = None
    for wi, width in enumerate(widths):
        grid = table[wi]
        complete = ~np.isnan(grid).any(axis=0)
        if not complete.any():
            continue
        grid = grid[:, complete]
        means = np.where(np.isinf(grid).any(axis=1), np.inf, grid.mean(axis=1))
        boots = []
        for _ in range(resamples):
            pick = rng.integers(0, grid.shape[1], grid.shape[1])
            sample = grid[:, pick]
            boots.append(optimum(lrs, np.where(np.isinf(sample).any(axis=1), np.inf, sample.mean(axis=1))))
        best = optimum(lrs, means)
        if base_best is None:
            base_best = best
        # The base width's optimum, transferred: the grid point nearest to it, its loss against this width's best.
        transferred = int(np.argmin(np.abs(np.log2(lrs) - base_best)))
        i = int(np.argmin(means))
        paired = grid[transferred] - grid[i]
        noise = float(np.std(grid[i], ddof=1)) if grid.shape[1] > 1 else float("nan")
        result["per_width"].append({
            "width": width, "seeds": int(grid.shape[1]), "mean_loss": [float(m) for m in means],
            "best_log2_lr": best,
            "interval_log2_lr": [float(np.percentile(boots, 2.5)), float(np.percentile(boots, 97.5))],
            "grid_best_lr": lrs[i], "steps_from_base": best - base_best,
            "transferred_lr": lrs[transferred],
            "regret": float(np.mean(paired)) if np.all(np.isfinite(paired)) else math.inf,
            "regret_se": float(np.std(paired, ddof=1) / math.sqrt(len(paired))) if len(paired) > 1 else math.nan,
            "seed_sd_at_best": noise})
    return result


def plot(results: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 4), sharey=True, squeeze=False)
    for ax, (p, r) in zip(axes[0], results.items(), strict=True):
        for row in r["per_width"]:
            line, = ax.plot(r["lrs"], row["mean_loss"], marker="o", label=f"width {row['width']}")
            lo, hi = row["interval_log2_lr"]
            ax.axvspan(2 ** lo, 2 ** hi, color=line.get_color(), alpha=0.12)
            ax.axvline(2 ** row["best_log2_lr"], color=line.get_color(), ls=":", lw=1)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("learning rate")
        ax.set_title(f"{p}: final {METRIC} ({r['seeds'].__len__()} seeds)")
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel(f"{METRIC} (mean over seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--widths", default="32,64,128,256")
    parser.add_argument("--lrs", default="0.002,0.004,0.008,0.016,0.032", help="a factor-2 grid")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--parametrizations", default=",".join(PARAMETRIZATIONS))
    parser.add_argument("--parallel", type=int, default=1)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--figure", type=Path, default=FIGURE)
    parser.add_argument("--analyse", action="store_true", help="only read the store and redraw")
    a = parser.parse_args(argv)
    a.widths = [int(w) for w in a.widths.split(",")]
    a.lrs = [float(v) for v in a.lrs.split(",")]
    a.parametrizations = a.parametrizations.split(",")
    a.out.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{(a.out / 'mlflow.db').resolve()}"
    if not a.analyse:
        run_sweeps(a, uri)
    rng = np.random.default_rng(0)
    results = {p: analyse(read_losses(uri, p), a.widths, a.lrs, rng) for p in a.parametrizations}
    a.figure.parent.mkdir(parents=True, exist_ok=True)
    a.figure.with_suffix(".json").write_text(json.dumps(results, indent=1))
    plot(results, a.figure)
    for p, r in results.items():
        print(f"\n{p}: best lr per width (log2; 95% bootstrap interval over seeds), base = width {a.widths[0]}")
        for row in r["per_width"]:
            lo, hi = row["interval_log2_lr"]
            print(f"  width {row['width']:>5}: best lr {2 ** row['best_log2_lr']:.4g} (2^{row['best_log2_lr']:+.2f}, "
                  f"[{lo:+.2f}, {hi:+.2f}]), {row['steps_from_base']:+.2f} grid steps from base; at the base's lr "
                  f"{row['transferred_lr']:g}: regret {row['regret']:+.4f} ± {row['regret_se']:.4f} (se), seed sd "
                  f"{row['seed_sd_at_best']:.4f}, n={row['seeds']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
