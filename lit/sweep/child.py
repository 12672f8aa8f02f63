"""One child run of a sweep: its ``fit`` command line, and running it in this process.

The same function runs a child whether a local sweep forked it or a SLURM array task started it
(``python -m lit.sweep.child MANIFEST PHASE INDEX``), so both log the same run into the same store.
A seed run of a tuned variant looks up the tuned value in the store when it starts (the tuning runs
may have run on other machines), and a seed run that reuses the tuning run only tags it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from lit.errors import UserInputError
from lit.sweep import protocol as P
from lit.sweep.grid import CONFIG_KEY, Child
from lit.sweep.ladder import rung_tags

# Quiet children by default (their output goes to a log file each); a fit option given to the sweep wins.
CHILD_DEFAULTS = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


def fit_args(manifest: dict, child: Child, tune_value: str | None) -> list[str]:
    """The ``cli.py fit`` arguments of a child run.

    Order matters (later wins): the recipe, the variant's extra YAML files, the sweep's fit options, the
    variant's values, the tuned value, then what the sweep owns (seeds, budget, where it logs).
    """
    overrides = dict(child.overrides)
    tune = manifest["protocol"]["tune"]
    if child.phase == "seed" and tune is not None:
        overrides[tune["key"]] = tune_value
    configs = [v for k, v in overrides.items() if k == CONFIG_KEY]
    tags = {P.PARENT_RUN: manifest["parent_run_id"], P.ROLE: P.CHILD, P.SWEEP_ID: manifest["protocol"]["sweep_id"],
            P.VARIANT: child.variant, P.SEED: str(child.seed), P.SEED_INDEX: str(child.seed_index),
            P.PHASE: child.phase, P.CHILD_KEY: child.key}
    if tune is not None:
        tags[P.TUNE_KEY] = tune["key"]
        tags[P.TUNE_VALUE] = str(child.tune_value if child.phase == "tune" else tune_value)
    if child.phase == "seed":
        tags[P.FINAL] = P.TRUE
    tags.update(rung_tags(manifest, child))
    run_name = f"{child.variant} | " + (f"tune {child.tune_value}" if child.phase == "tune" else f"seed {child.seed}")
    args = ["fit", "--config", manifest["recipe"]]
    for config in configs:
        args += ["--config", config]
    args += CHILD_DEFAULTS + list(manifest["fit_args"])
    args += [f"--{k}={v}" for k, v in overrides.items() if k != CONFIG_KEY]
    args += [f"--seed_everything={child.seed}", f"--data.seed={child.seed}"]
    if child.steps is not None:
        args.append(f"--trainer.max_steps={child.steps}")
    logger = "--trainer.logger.init_args."
    args += [f"{logger}experiment_name={manifest['experiment']}", f"{logger}tracking_uri={manifest['tracking_uri']}",
             f"{logger}run_name={run_name}", f"{logger}tags={json.dumps(tags)}",
             f"{logger}save_dir={manifest['save_dir']}"]
    return args


def run_child(manifest: dict, child: Child) -> int:
    """Run one child in this process; returns an exit code (0 done, 2 a user error, 1 a crash)."""
    from mlflow import MlflowClient

    from lit.cli import main as cli_main
    from lit.sweep.store import experiment_id_for, pick_tuned_value

    proto = manifest["protocol"]
    tune_value = None
    if child.phase == "seed" and proto["tune"] is not None:
        client = MlflowClient(manifest["tracking_uri"])
        try:
            experiment_id = experiment_id_for(client, manifest["experiment"])
            tune_value, tuning_run = pick_tuned_value(client, experiment_id, proto["sweep_id"], child.variant,
                                                      proto["tune"]["values"], proto["metric"])
        except UserInputError as exc:
            sys.stderr.write(f"error: {exc}\n")
            return 2
        if child.reuse:
            # The tuning run at the picked value ran this very seed at the full budget: it is the seed run.
            client.set_tag(tuning_run.info.run_id, P.FINAL, P.TRUE)
            return 0
    try:
        cli_main(fit_args(manifest, child, tune_value))
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


def load_manifest(path: str | Path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise UserInputError(f"cannot read the sweep manifest {path}: {exc}") from exc


def children_of(manifest: dict, phase: str) -> list[Child]:
    return [Child(**c) for c in manifest["children"] if c["phase"] == phase]


def main(argv: list[str] | None = None) -> int:
    """``python -m lit.sweep.child MANIFEST PHASE INDEX``: one array task of a SLURM sweep.

    Skips the child if a run of it already FINISHED (a requeued or resubmitted array redoes nothing).
    """
    import argparse

    from mlflow import MlflowClient

    from lit.sweep.store import child_runs, experiment_id_for, finished_by_key

    parser = argparse.ArgumentParser(prog="python -m lit.sweep.child", description=main.__doc__.splitlines()[0])
    parser.add_argument("manifest")
    parser.add_argument("phase", choices=["tune", "seed"])
    parser.add_argument("index", type=int, help="the array index ($SLURM_ARRAY_TASK_ID)")
    a = parser.parse_args(argv)
    try:
        manifest = load_manifest(a.manifest)
        children = children_of(manifest, a.phase)
        if not 0 <= a.index < len(children):
            raise UserInputError(f"index {a.index} is outside the {len(children)} {a.phase} runs of {a.manifest}")
        child = children[a.index]
        client = MlflowClient(manifest["tracking_uri"])
        experiment_id = experiment_id_for(client, manifest["experiment"])
        if child.key in finished_by_key(child_runs(client, experiment_id, manifest["protocol"]["sweep_id"])):
            print(f"{child.key}: already finished")
            return 0
    except UserInputError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    return run_child(manifest, child)


if __name__ == "__main__":
    sys.exit(main())
