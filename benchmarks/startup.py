"""What a run costs before and around its math: ``python cli.py fit`` to its first step, and a sweep child's fixed cost.

    python -m benchmarks.startup                          # this checkout, 3 repeats
    python -m benchmarks.startup --baseline /tmp/before   # interleaved with another checkout of the project

Two measurements, at the reproduction's text size (8 layers, d 128, 16 x 64 tokens):

- **fit to first step**: a fresh ``python cli.py fit`` process, from its launch to the start of its first training
  batch (``StampFirstStep`` writes the time there and ends the process), with the process's CPU seconds. It is
  what a user waits for, and what a SLURM array task pays per run.
- **a sweep child's fixed cost**: ``python cli.py sweep`` of a 1-step run (validation and test on 2 batches each,
  ``--parallel 1``) over 1 seed and over ``--children`` seeds. Each child is timed from the sweep's ``start`` line
  to its ``done`` line as this process reads them: the launcher's dispatch, parse and build, setup, the step,
  validation, ``trainer.test`` and the MLflow bookkeeping (claim, heartbeat, tags, end of run); the first child of
  a sweep is reported apart (with workers it carries what a worker pays once). The difference between the two
  sweeps per extra child is the **marginal cost of a child**, in wall and in CPU seconds (the sweep and all it
  ran): on a loaded machine the CPU seconds are the figure to compare, wall time stretches with the load.

Each repeat runs every checkout in turn (interleaved), so load on the machine hits all alike; medians and the
spread (min-max) over repeats are printed. Figures: docs/performance/startup.md.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import lightning as L

REPO = Path(__file__).resolve().parents[1]
STAMP = "ARCH_LAB_FIRST_STEP_STAMP"
BUDGET = ["--model.arch.n_layers=8", "--data.batch_size=16", "--data.block_size=64", "--trainer.max_steps=1",
          "--trainer.log_every_n_steps=1"]
CHILD_BUDGET = ["--trainer.val_check_interval=1", "--trainer.limit_val_batches=2", "--trainer.limit_test_batches=2"]


class StampFirstStep(L.Callback):
    """Writes the wall-clock time at the start of the first training batch to ``$ARCH_LAB_FIRST_STEP_STAMP`` and
    ends the process there (what follows is not start-up)."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        Path(os.environ[STAMP]).write_text(repr(time.time()))
        sys.stdout.flush()
        os._exit(0)


def env_for(repo: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(repo), **extra}


def fit_to_first_step(repo: Path) -> tuple[float, float]:
    """(wall seconds from launch to the first batch, CPU seconds of the process) of a fresh ``cli.py fit``."""
    with tempfile.TemporaryDirectory() as tmp:
        stamp = Path(tmp) / "stamp"
        args = [sys.executable, str(repo / "cli.py"), "fit", "--config", str(repo / "recipes" / "gpt_baseline.yaml"),
                *BUDGET, "--trainer.enable_progress_bar=false", "--trainer.num_sanity_val_steps=0",
                "--trainer.callbacks+=benchmarks.startup.StampFirstStep",
                f"--trainer.logger.init_args.tracking_uri=sqlite:///{tmp}/mlflow.db"]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        launched = time.time()
        out = subprocess.run(args, cwd=tmp, env=env_for(repo, **{STAMP: str(stamp)}), capture_output=True, text=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if not stamp.exists():
            raise RuntimeError(f"{repo}: fit never reached its first step:\n{out.stderr[-3000:]}")
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        return float(stamp.read_text()) - launched, cpu


def sweep_children(repo: Path, children: int) -> tuple[list[float], float, float]:
    """A 1-step sweep of ``children`` seeds: each child's seconds from ``start`` to ``done`` as this process reads
    them, the sweep's wall seconds and the CPU seconds of the sweep and everything it ran."""
    with tempfile.TemporaryDirectory() as tmp:
        args = [sys.executable, str(repo / "cli.py"), "sweep", "--config", str(repo / "recipes" / "gpt_baseline.yaml"),
                "--seeds", str(children), "--parallel", "1", "--experiment", "startup", *BUDGET, *CHILD_BUDGET]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        launched = time.monotonic()
        proc = subprocess.Popen(args, cwd=tmp, env=env_for(repo), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        started, seconds, lines = {}, [], []
        for line in proc.stdout:
            now = time.monotonic()
            lines.append(line)
            if m := re.match(r"start (\S+) ", line):
                started[m.group(1)] = now
            elif m := re.match(r"done (\S+) in ", line):
                seconds.append(now - started[m.group(1)])
        if proc.wait() != 0 or len(seconds) != children:
            raise RuntimeError(f"{repo}: the sweep failed:\n{''.join(lines[-30:])}")
        wall = time.monotonic() - launched
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        return seconds, wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):6.2f} s ({min(values):.2f}-{max(values):.2f}, n={len(values)})"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--children", type=int, default=4, help="children of the longer sweep (the shorter has 1)")
    p.add_argument("--baseline", type=Path, help="another checkout, measured interleaved with this one")
    p.add_argument("--skip", choices=["fit", "sweep"], help="measure only the other one")
    a = p.parse_args(argv)
    repos = {"this": REPO, **({"baseline": a.baseline.resolve()} if a.baseline else {})}
    rows = {name: {k: [] for k in ("fit wall", "fit cpu", "first", "later", "marginal wall", "marginal cpu")}
            for name in repos}
    for r in range(a.repeats):
        for name, repo in (list(repos.items()) if r % 2 == 0 else list(reversed(repos.items()))):
            row = rows[name]
            if a.skip != "fit":
                wall, cpu = fit_to_first_step(repo)
                row["fit wall"].append(wall)
                row["fit cpu"].append(cpu)
                print(f"repeat {r + 1} {name}: fit to first step {wall:.2f} s wall, {cpu:.2f} s CPU", flush=True)
            if a.skip != "sweep":
                _, wall_1, cpu_1 = sweep_children(repo, 1)
                seconds, wall_n, cpu_n = sweep_children(repo, a.children)
                row["first"].append(seconds[0])
                row["later"] += seconds[1:]
                # What one more child adds to the whole sweep: its fixed cost without the sweep's own start.
                row["marginal wall"].append((wall_n - wall_1) / (a.children - 1))
                row["marginal cpu"].append((cpu_n - cpu_1) / (a.children - 1))
                print(f"repeat {r + 1} {name}: sweep of 1: {wall_1:.1f} s wall, {cpu_1:.1f} s CPU; of {a.children}: "
                      f"{wall_n:.1f} s wall, {cpu_n:.1f} s CPU, children {' '.join(f'{s:.2f}' for s in seconds)} s",
                      flush=True)
    print(f"\nload average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    labels = {"fit wall": "fit to first step, wall", "fit cpu": "fit to first step, CPU",
              "first": "sweep child, first of a sweep, wall", "later": "sweep child, later ones, wall",
              "marginal wall": "one more child, sweep wall", "marginal cpu": "one more child, sweep CPU"}
    for name in repos:
        print(f"\n{name} ({repos[name]})")
        for key, label in labels.items():
            if rows[name][key]:
                print(f"  {label:38s} {spread(rows[name][key])}")


if __name__ == "__main__":
    main()
