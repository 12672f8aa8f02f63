"""The scaling report: the muP baseline and four of the reproduction report's leads up a ladder of four widths,
each with its effective-compute multiplier and interval. A preset of ``cli.py sweep`` (the base learning rate),
``cli.py sweep --ladder`` and ``cli.py compare --scaling``.

The ladder is sized for this project's 2-core CPU machine: tinyshakespeare (char level), 2 layers, 2 heads,
widths 24, 32, 48 and 64 (about 36x compute from the smallest rung to the largest), 10 training tokens per
non-embedding parameter of the baseline (every variant trains on the same tokens at a rung), 32 x 128 tokens per
step, warm-up over the first 10% of each rung's steps, 3 paired seeds, the final ``test/loss``.

The learning rate transfers: the baseline (``recipes/gpt_ladder_mup.yaml``) is muP at its base shape, the first
rung, and its learning rate is tuned there first, at the first rung's budget (a sweep over a grid of sqrt(2)
steps, 3 seeds of its own, the lowest mean final validation loss picked). The ladder then keeps it at every rung
(``--ladder_lr transfer``: muP scales it per matrix) and checks it at lr/2 and 2 lr on the first seed of every
variant at every rung (``--ladder_lr_check all``). The variants change one component of the baseline and nothing
else, so they share its learning rate.
Run from the repository root::

    python -m benchmarks.ladder                 # the base learning rate (once), the ladder (resumes), the report
    python -m benchmarks.ladder --report-only   # the report from the stored runs
    python -m benchmarks.ladder --variants perinorm postnorm --seeds 3   # a reduced ladder
    mlflow ui --backend-store-uri sqlite:///benchmarks/out/ladder-mup.db

Writes docs/scale/ladder/ (``compare --scaling``'s report.md and figures, and base_lr.md: the tuning sweep's
losses). The commands are printed first, so the preset also documents them.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import time

import yaml

from lit.commands import main as cli
from lit.compare.runs import connect, find_parent
from lit.errors import UserInputError
from lit.sweep import protocol
from lit.sweep.store import search_all_runs

STORE = "sqlite:///benchmarks/out/ladder-mup.db"
EXPERIMENT = "scaling-ladder-mup"
BASE_EXPERIMENT = "scaling-ladder-mup-base-lr"
OUT = "docs/scale/ladder"
RECIPE = "recipes/gpt_ladder_mup.yaml"
# Steps of sqrt(2) around the rate that trains the first rung best, each on 3 seeds of their own: one tuning
# seed picked 8e-3 here, which the ladder's check then found at its grid's edge (2 lr better) at every rung and
# for every variant, on the first evaluation seed. At 40 steps the spread between seeds is as large as the
# differences between neighbouring rates, so the pick averages seeds.
BASE_LRS = "4e-3,8e-3,1.1e-2,1.6e-2,2.3e-2,3.2e-2"
BASE_SEEDS = 3
BASE_SEED_BASE = 1000  # outside the ladder's evaluation seeds (the recipe's 1337 on)
# One component changed on the baseline each, as its recipe changes it (recipes/gpt_<name>.yaml): everything
# else, the learning rate included, is the baseline's.
VARIANTS = {
    "perinorm": "model.arch.norm=perinorm",
    "postnorm": "model.arch.norm=postnorm,model.arch.norm_options.final_norm=true,"
                "model.arch.depth_scaled_init=false",
    "attnres_block": "model.arch.residual=attnres_block,model.arch.residual_options.block_size=2",
    "hyperconn": "model.arch.residual=hyperconn,model.arch.residual_options.streams=4",
}
RUNGS = ";".join(f"d_model={d},n_layers=2,n_heads=2" for d in (24, 32, 48, 64))
TOKENS_PER_PARAM = "10"


def base_lr_command(parallel: int) -> list[str]:
    """The base learning rate: the baseline at the first rung's shape and budget (the recipe's) at every value
    of the grid, on seeds of their own."""
    return ["sweep", "--config", RECIPE, f"--vary=model.lr={BASE_LRS}", "--seeds", str(BASE_SEEDS),
            "--seed_base", str(BASE_SEED_BASE), "--experiment", BASE_EXPERIMENT, "--tracking_uri", STORE,
            "--parallel", str(parallel)]


def sweep_command(variants: list[str], seeds: int, parallel: int) -> list[str]:
    command = ["sweep", "--config", RECIPE, "--ladder", RUNGS, "--tokens_per_param", TOKENS_PER_PARAM,
               "--ladder_lr", "transfer", "--ladder_lr_check", "all", "--seeds", str(seeds),
               "--experiment", EXPERIMENT, "--tracking_uri", STORE, "--parallel", str(parallel)]
    for name in variants:
        command += ["--variant", VARIANTS[name]]
    return command


def report_command() -> list[str]:
    return ["compare", "--scaling", "--experiment", EXPERIMENT, "--tracking_uri", STORE, "--out", OUT]


def recipe_lr() -> float:
    with open(RECIPE) as f:
        return float(yaml.safe_load(f)["model"]["init_args"]["lr"])


def base_losses() -> dict[float, list[float]]:
    """The tuning sweep's final validation losses (what tuning reads), per learning rate."""
    client = connect(STORE)
    parent = find_parent(client, experiment=BASE_EXPERIMENT)
    finished = f"tags.`{protocol.PARENT_RUN}` = '{parent.info.run_id}' and attributes.status = 'FINISHED'"
    children = search_all_runs(client, parent.info.experiment_id, finished)
    losses: dict[float, list[float]] = {}
    for run in children:
        if "val/loss" in run.data.metrics:
            losses.setdefault(float(run.data.params["model.init_args.lr"]), []).append(run.data.metrics["val/loss"])
    return dict(sorted(losses.items()))


def tuned_lr() -> float:
    """The learning rate with the lowest mean final validation loss over the tuning seeds. Writes the table
    (docs/scale/ladder/base_lr.md) from the stored runs."""
    losses = base_losses()
    pick = min(losses, key=lambda lr: statistics.mean(losses[lr]))
    rows = [f"| {lr:g} | {statistics.mean(v):.4f} | {', '.join(f'{x:.4f}' for x in v)} |"
            + (" **picked** |" if lr == pick else " |") for lr, v in losses.items()]
    table = "\n".join(["| lr | mean final val/loss | per seed | |", "|---|---|---|---|", *rows])
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "base_lr.md"), "w") as f:
        f.write(f"# The ladder's base learning rate\n\nThe baseline (`{RECIPE}`) at the first rung's shape and "
                f"budget, {BASE_SEEDS} seeds from {BASE_SEED_BASE} (outside the ladder's), written by "
                f"`python -m benchmarks.ladder` from the stored runs. The pick: the lowest mean.\n\n{table}\n")
    print(table, flush=True)
    return pick


def tuned_already() -> bool:
    """Whether the store holds the base-width tuning sweep. It is run once: setting the recipe's learning rate to
    its pick changes the recipe, which a sweep refuses to resume (its identity covers the recipe's content)."""
    try:
        find_parent(connect(STORE), experiment=BASE_EXPERIMENT)
    except UserInputError:
        return False
    return True


def check_recipe_lr() -> None:
    """The recipe is the experiment's record: its learning rate must be the one tuned at the base shape."""
    tuned, recipe = tuned_lr(), recipe_lr()
    if tuned != recipe:
        raise UserInputError(f"the base-width tuning picked lr {tuned:g} but {RECIPE} has {recipe:g}; set its "
                             f"model.init_args.lr to {tuned:g}, then run the preset again (the ladder transfers "
                             "the recipe's rate)")


def run(command: list[str]) -> int:
    print("$ python cli.py " + shlex.join(command), flush=True)
    return cli(command)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ladder", description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=list(VARIANTS),
                        help="the components run beside the baseline (default: all four)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--report-only", action="store_true", help="report the stored runs; train nothing")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.makedirs("benchmarks/out", exist_ok=True)
    started = time.time()
    if not args.report_only:
        if tuned_already():
            print(f"base learning rate: tuned already ({BASE_EXPERIMENT} in {STORE})", flush=True)
        elif (code := run(base_lr_command(args.parallel))) != 0:
            return code
        try:
            check_recipe_lr()
        except UserInputError as error:
            print(f"error: {error}", file=sys.stderr, flush=True)
            return 2
        code = run(sweep_command(args.variants, args.seeds, args.parallel))
        if code != 0:
            return code
        print(f"ladder sweeps: {time.time() - started:.0f} s wall", flush=True)
    return run(report_command())


if __name__ == "__main__":
    raise SystemExit(main())
