"""The scaling report: the muP baseline and four of the reproduction report's leads up a ladder of four widths,
each with its effective-compute multiplier and interval. A preset of ``cli.py sweep`` (the base learning rate),
``cli.py sweep --ladder`` and ``cli.py compare --scaling``.

The ladder is sized for this project's 2-core CPU machine: tinyshakespeare (char level), 2 layers, 2 heads,
widths 24, 32, 48 and 64 (about 36x compute from the smallest rung to the largest), 10 training tokens per
non-embedding parameter of the baseline (every variant trains on the same tokens at a rung), 32 x 128 tokens per
step, warm-up over the first 10% of each rung's steps, 3 paired seeds, the final ``test/loss``.

The learning rate transfers: the baseline (``recipes/gpt_ladder_mup.yaml``) is muP at its base shape, the first
rung, and its learning rate is tuned there first, at the first rung's budget (a sweep over a factor-2 grid on a
tuning seed, never counted). The ladder then keeps it at every rung (``--ladder_lr transfer``: muP scales it per
matrix) and checks it at lr/2 and 2 lr on the first seed of every variant at every rung (``--ladder_lr_check
all``). The variants change one component of the baseline and nothing else, so they share its learning rate.
Run from the repository root::

    python -m benchmarks.ladder                 # the base learning rate (once), the ladder (resumes), the report
    python -m benchmarks.ladder --report-only   # the report from the stored runs
    python -m benchmarks.ladder --variants perinorm postnorm --seeds 3   # a reduced ladder
    mlflow ui --backend-store-uri sqlite:///benchmarks/out/ladder.db

Writes docs/scale/ladder/ (``compare --scaling``'s report.md and figures) and docs/scale/ladder/base_lr/
(``compare``'s report of the tuning sweep). The commands are printed first, so the preset also documents them.
"""

from __future__ import annotations

import argparse
import os
import shlex
import time

import yaml

from lit.commands import main as cli
from lit.compare.runs import connect, find_parent, load_sweep
from lit.errors import UserInputError

STORE = "sqlite:///benchmarks/out/ladder.db"
EXPERIMENT = "scaling-ladder-mup"
BASE_EXPERIMENT = "scaling-ladder-mup-base-lr"
OUT = "docs/scale/ladder"
RECIPE = "recipes/gpt_ladder_mup.yaml"
# Factor-2 steps, the ladder's own check's step, around the rate that trains 40 steps best.
BASE_LRS = "4e-3,8e-3,1.6e-2,3.2e-2,6.4e-2"
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
    """The base learning rate: the baseline at the first rung's shape and budget (the recipe's), tuned per
    value on the tuning seed; one evaluation seed at the pick so the sweep can report it."""
    return ["sweep", "--config", RECIPE, f"--tune=model.lr={BASE_LRS}", "--seeds", "1",
            "--experiment", BASE_EXPERIMENT, "--tracking_uri", STORE, "--parallel", str(parallel)]


def sweep_command(variants: list[str], seeds: int, parallel: int) -> list[str]:
    command = ["sweep", "--config", RECIPE, "--ladder", RUNGS, "--tokens_per_param", TOKENS_PER_PARAM,
               "--ladder_lr", "transfer", "--ladder_lr_check", "all", "--seeds", str(seeds),
               "--experiment", EXPERIMENT, "--tracking_uri", STORE, "--parallel", str(parallel)]
    for name in variants:
        command += ["--variant", VARIANTS[name]]
    return command


def report_commands() -> list[list[str]]:
    return [["compare", "--experiment", BASE_EXPERIMENT, "--tracking_uri", STORE, "--out", f"{OUT}/base_lr"],
            ["compare", "--scaling", "--experiment", EXPERIMENT, "--tracking_uri", STORE, "--out", OUT]]


def recipe_lr() -> float:
    with open(RECIPE) as f:
        return float(yaml.safe_load(f)["model"]["init_args"]["lr"])


def tuned_lr() -> float:
    """The baseline's picked learning rate in the tuning sweep, as its counted seed run ran it."""
    client = connect(STORE)
    values = load_sweep(client, find_parent(client, experiment=BASE_EXPERIMENT)).runs["tune_value"].dropna()
    return float(values.iloc[0])


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
            print(f"error: {error}", flush=True)
            return 2
        code = run(sweep_command(args.variants, args.seeds, args.parallel))
        if code != 0:
            return code
        print(f"ladder sweeps: {time.time() - started:.0f} s wall", flush=True)
    for command in report_commands():
        code = run(command)
        if code != 0:
            return code
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
