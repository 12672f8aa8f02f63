"""What a small sweep costs, before and after a change: the same 12-run sweep from two commits, back to back.

The sweep is the reproduction's text budget (8 layers, 300 steps of 16 x 64 tokens, validation every 50 steps on
16 batches, tuning at 150 steps): 2 variants (the RMSNorm baseline and LayerNorm) x 4 paired seeds, each variant
tuned over 2 learning rates on a seed of its own, so 4 tuning runs and 8 seed runs. Each commit is checked out
in a git worktree and runs its own `cli.py sweep` into a store of its own; this script then reads every run's
final `test/loss` from both stores and prints the wall time of each sweep and the per-seed losses side by side.

    python -m benchmarks.sweep_cost --before 83880ed --after HEAD --rounds 1 --out /tmp/sweep_cost.md

The measured run is on docs/performance/sweep-cost.md.

Both sweeps run on the same machine one after the other (``--rounds 2`` alternates the order, so drift and other
load hit both alike); the machine's load average before and after each sweep is recorded beside its time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

BUDGET = ["--model.arch.n_layers=8", "--trainer.max_steps=300", "--data.batch_size=16", "--data.block_size=64",
          "--trainer.val_check_interval=50", "--trainer.limit_val_batches=16", "--trainer.log_every_n_steps=10",
          "--trainer.num_sanity_val_steps=0"]


def sweep_command(store: str, out: Path, parallel: int) -> list[str]:
    return [sys.executable, "cli.py", "sweep", "--config", "recipes/gpt_baseline.yaml",
            "--vary", "model.arch.norm=rmsnorm,layernorm", "--seeds", "4", "--tune", "model.lr=2e-3,6e-3",
            "--tune_steps", "150", "--metric", "val/loss", "--report_metric", "test/loss",
            "--experiment", "sweep-cost", "--tracking_uri", store, "--parallel", str(parallel),
            "--out", str(out), *BUDGET]


def worktree(commit: str, where: Path) -> Path:
    path = where / commit.replace("/", "_")
    subprocess.run(["git", "worktree", "add", "--detach", str(path), commit], cwd=REPO, check=True,
                   capture_output=True)
    return path


def run_sweep(checkout: Path, store_dir: Path, parallel: int) -> dict:
    store = f"sqlite:///{store_dir / 'store.db'}"
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(checkout)}
    done = subprocess.run(sweep_command(store, store_dir / "out", parallel), cwd=checkout, env=env,
                          capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"error: the sweep in {checkout} failed:\n{done.stderr[-3000:]}")
    return {"wall_s": wall, "load_before": load_before, "load_after": os.getloadavg()[0],
            "losses": seed_losses(store)}


def seed_losses(store: str) -> dict[str, float]:
    """``variant/seed -> test/loss`` of every counted seed run, and ``variant/tune=<lr> -> val/loss`` of tuning."""
    import mlflow

    client = mlflow.MlflowClient(store)
    experiment = client.get_experiment_by_name("sweep-cost")
    prefix = "tags.`arch_lab.sweep."
    runs = client.search_runs([experiment.experiment_id], f"{prefix}role` = 'child'", max_results=1000)
    found = {}
    for run in runs:
        tags, metrics = run.data.tags, run.data.metrics
        variant, phase = tags["arch_lab.sweep.variant"], tags["arch_lab.sweep.phase"]
        if phase == "tune":
            found[f"{variant} tune lr={tags['arch_lab.sweep.tune_value']} (val/loss)"] = metrics.get("val/loss")
        elif tags.get("arch_lab.sweep.final") == "true":
            found[f"{variant} seed {tags['arch_lab.sweep.seed']} (test/loss)"] = metrics.get("test/loss")
    return dict(sorted(found.items()))


def render(before: str, after: str, rounds: list[dict]) -> str:
    lines = [f"# A 12-run sweep before ({before}) and after ({after})", "",
             "Command: see `benchmarks/sweep_cost.py` (2 variants x 4 seeds, each tuned over 2 learning rates, the "
             "reproduction's text budget).", "",
             "| round | commit | wall time (s) | load average at start / end |", "|---|---|---:|---|"]
    for i, r in enumerate(rounds):
        for name in r["order"]:
            m = r[name]
            lines.append(f"| {i + 1} | {name} | {m['wall_s']:.0f} | {m['load_before']:.1f} / {m['load_after']:.1f} |")
    lines += ["", "Per-run losses (last round):", "", f"| run | {before} | {after} | equal |", "|---|---:|---:|---|"]
    last = rounds[-1]
    for key in sorted(set(last["before"]["losses"]) | set(last["after"]["losses"])):
        a, b = last["before"]["losses"].get(key), last["after"]["losses"].get(key)
        same = "yes" if a == b else (f"no ({b - a:+.2e})" if a is not None and b is not None else "missing")
        lines.append(f"| {key} | {a!r} | {b!r} | {same} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", required=True, help="the commit to measure first (e.g. the last one before)")
    parser.add_argument("--after", default="HEAD")
    parser.add_argument("--rounds", type=int, default=1, help="alternate the order each round")
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--out", type=Path, help="write the Markdown table here (and the JSON beside it)")
    args = parser.parse_args(argv)
    rounds = []
    with tempfile.TemporaryDirectory(prefix="sweep-cost-") as tmp:
        tmp = Path(tmp)
        checkouts = {"before": worktree(args.before, tmp / "before"), "after": worktree(args.after, tmp / "after")}
        try:
            for i in range(args.rounds):
                order = ["before", "after"] if i % 2 == 0 else ["after", "before"]
                result = {"order": order}
                for name in order:
                    store = tmp / f"store-{name}-{i}"
                    store.mkdir(parents=True)
                    result[name] = run_sweep(checkouts[name], store, args.parallel)
                    print(f"round {i + 1} {name}: {result[name]['wall_s']:.0f} s", flush=True)
                rounds.append(result)
        finally:
            for path in checkouts.values():
                subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=REPO, capture_output=True)
    text = render(args.before, args.after, rounds)
    print(text)
    if args.out:
        args.out.write_text(text)
        args.out.with_suffix(".json").write_text(json.dumps(rounds, indent=1))


if __name__ == "__main__":
    main()
