"""``python cli.py sweep``: variants x seeds (a learning rate tuned per variant), one MLflow parent run.

    python cli.py sweep --config recipes/gpt_baseline.yaml --vary model.arch.norm=rmsnorm,dyt,perinorm \\
        --seeds 3 --tune model.lr=1e-3,3e-3,1e-2 --parallel 2 --trainer.max_steps=300
    python cli.py compare --experiment sweep-gpt_baseline

Options it does not know are ``fit`` options, applied to every run. Rerunning the same command resumes:
children with a FINISHED run are skipped, failed or killed ones run again.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import time
from pathlib import Path

import yaml

from lit.errors import OneLineArgumentParser, UserInputError
from lit.sweep import ladder
from lit.sweep import protocol as P
from lit.sweep.grid import Child, Tuning, build_children, build_variants, find_baseline, parse_values, sweep_id

EPILOG = """\
Each run is `cli.py fit --config RECIPE [variant] [fit options] --seed_everything=S --data.seed=S`: seed S is
the init seed and the data order of that run in every variant, so the variants' differences pair by seed.
Tuning: each variant tries every --tune value on the first seed; the seeds run at the value with the best
final --metric (with the full budget, that first-seed tuning run is reused as its seed run).
Runs log to one experiment: a parent run holds the protocol, a child run per (variant, seed) holds the
metrics. Then: python cli.py compare --experiment NAME."""


def parser() -> argparse.ArgumentParser:
    p = OneLineArgumentParser(prog="cli.py sweep", description=__doc__.splitlines()[0], epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="the recipe every run starts from")
    p.add_argument("--vary", action="append", default=[], metavar="KEY=V1,V2",
                   help="a config key and its values; several --vary make a grid")
    p.add_argument("--variant", action="append", default=[], metavar="KEY=V[,KEY=V]",
                   help="one more variant (several keys at once; config=FILE layers a YAML file); with only "
                        "--variant options the unchanged recipe is the first variant; with neither --vary nor "
                        "--variant the recipe alone runs over the seeds")
    p.add_argument("--seeds", type=int, default=3, help="seeds per variant (default 3)")
    p.add_argument("--seed_base", type=int, default=None,
                   help="first seed (default: the recipe's seed_everything, else 0); seeds are consecutive")
    p.add_argument("--tune", metavar="KEY=A,B,C", help="tune this key per variant over these values")
    p.add_argument("--tune_steps", type=int, default=None,
                   help="budget of the tuning runs (default: the full budget, reusing the first seed's run)")
    p.add_argument("--baseline", metavar="KEY=V", help="the variant the others are compared with (default: first)")
    p.add_argument("--metric", default="val/loss", help="the metric tuning picks by and compare reports")
    p.add_argument("--experiment", help="MLflow experiment (default: sweep-<recipe name>)")
    p.add_argument("--tracking_uri", help="MLflow store (default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db)")
    p.add_argument("--parallel", type=int, default=1, help="runs at once on this machine (local launch)")
    p.add_argument("--launch", choices=["local", "slurm"], default="local",
                   help="run here, or write a SLURM job-array script and a manifest instead")
    p.add_argument("--sbatch", action="append", default=[], metavar="OPTION",
                   help="an #SBATCH line for the job arrays, e.g. --sbatch=--gpus-per-task=1 (repeatable)")
    ladder.add_options(p)
    p.add_argument("--out", help="folder for the manifest, logs, checkpoints and scripts (default: sweeps/<id>)")
    return p


def recipe_facts(path: Path) -> dict:
    try:
        recipe = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise UserInputError(f"cannot read the recipe {path}: {exc}") from exc
    return recipe if isinstance(recipe, dict) else {}


def option_value(args: list[str], key: str) -> str | None:
    """The last value a list of ``--key=value`` / ``--key value`` options gives ``key``."""
    value = None
    for i, arg in enumerate(args):
        if arg == f"--{key}" and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(f"--{key}="):
            value = arg.split("=", 1)[1]
    return value


def build_protocol(a: argparse.Namespace, fit_options: list[str], measure_fn=None) -> tuple[dict, list[Child]]:
    recipe_path = Path(a.config).resolve()
    if not recipe_path.is_file():
        raise UserInputError(f"recipe {a.config} not found; pass --config recipes/<name>.yaml")
    recipe = recipe_facts(recipe_path)
    bad = [o for o in fit_options if o.startswith("-") and not o.startswith("--")]
    if bad or (fit_options and not fit_options[0].startswith("--")):
        raise UserInputError(f"cannot read {(bad or fit_options)[0]!r}: fit options are --key=value "
                             "(see `python cli.py sweep --help`)")
    if a.seeds < 1:
        raise UserInputError(f"--seeds must be at least 1, got {a.seeds}")
    if a.parallel < 1:
        raise UserInputError(f"--parallel must be at least 1, got {a.parallel}")
    variants = build_variants(a.vary, a.variant)
    baseline = find_baseline(variants, a.baseline)
    base = a.seed_base if a.seed_base is not None else recipe.get("seed_everything")
    base = base if isinstance(base, int) and not isinstance(base, bool) else 0
    seeds = [base + i for i in range(a.seeds)]
    steps = option_value(fit_options, "trainer.max_steps") or (recipe.get("trainer") or {}).get("max_steps")
    steps = int(steps) if steps not in (None, -1, "-1") else None
    tuning = None
    if a.tune:
        key, values = parse_values(a.tune, "--tune")
        if any(key in v.overrides for v in variants):
            raise UserInputError(f"{key} is both varied and tuned; tune it or vary it")
        if len(values) < 2:
            raise UserInputError(f"--tune {a.tune} has one value: nothing to pick from; give two or more")
        if a.tune_steps is not None and a.tune_steps < 1:
            raise UserInputError(f"--tune_steps must be at least 1, got {a.tune_steps}")
        short = a.tune_steps if a.tune_steps is not None and a.tune_steps != steps else None
        tuning = Tuning(key, values, short, seeds[0], reuse_seed_run=short is None)
    elif a.tune_steps is not None:
        raise UserInputError("--tune_steps needs --tune KEY=A,B,C")
    proto = {
        "recipe": str(recipe_path),
        "recipe_sha1": hashlib.sha1(recipe_path.read_bytes()).hexdigest(),
        "variants": [{"label": v.label, "overrides": v.overrides} for v in variants],
        "baseline": baseline.label, "seeds": seeds, "metric": a.metric, "mode": P.metric_mode(a.metric),
        "tune": None if tuning is None else {"key": tuning.key, "values": tuning.values, "steps": tuning.steps,
                                             "seed": tuning.seed, "reuse_seed_run": tuning.reuse_seed_run,
                                             "rule": tuning.rule},
        "fit_args": fit_options, "steps": steps,
    }
    rungs = ladder.plan(a, fit_options, str(recipe_path), variants, baseline, measure_fn)
    if rungs is not None:
        proto["ladder"] = rungs
    proto["sweep_id"] = sweep_id(proto)
    return proto, ladder.expand(build_children(variants, seeds, tuning), rungs)


def main(argv: list[str]) -> int:
    started = time.time()
    try:
        a, fit_options = parser().parse_known_args(argv)
        return _sweep(a, fit_options, started)
    except UserInputError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("interrupted: rerun the same command to resume (finished runs are kept)\n")
        return 130


def _sweep(a: argparse.Namespace, fit_options: list[str], started: float) -> int:
    from mlflow import MlflowClient

    from lit.sweep.store import child_runs, find_or_create_parent, finished_by_key, mark_stale_runs
    from lit.tracking.uri import resolve_tracking_uri, sqlite_creation_lock

    proto, children = build_protocol(a, fit_options)
    experiment = a.experiment or f"sweep-{Path(a.config).stem}"
    uri = resolve_tracking_uri(a.tracking_uri)
    out = Path(a.out or Path("sweeps") / proto["sweep_id"][:8]).resolve()
    out.mkdir(parents=True, exist_ok=True)
    with sqlite_creation_lock(uri):
        client = MlflowClient(uri)
        parent_id, existed = find_or_create_parent(client, experiment, proto)
    manifest = {"protocol": proto, "experiment": experiment, "tracking_uri": uri, "parent_run_id": parent_id,
                "recipe": proto["recipe"], "fit_args": fit_options, "save_dir": str(out / "runs"),
                "children": [c.to_json() for c in children]}
    manifest_path = out / "manifest.json"
    manifest_path.write_text(json.dumps(manifest, indent=1))
    n_variants, n_tune = len(proto["variants"]), sum(c.phase == "tune" for c in children)
    print(f"sweep {proto['sweep_id']} ({'resumed' if existed else 'new'}): {n_variants} variants x "
          f"{len(proto['seeds'])} seeds" + (f", {n_tune} tuning runs" if n_tune else "") +
          f"; parent run {parent_id} in experiment {experiment!r} ({uri})", flush=True)
    if a.launch == "slurm":
        from lit.sweep.slurm import write_scripts

        submit = write_scripts(manifest, manifest_path, out, a.sbatch)
        print(f"wrote {manifest_path} and the job arrays; submit with: bash {submit}")
        return 0
    experiment_id = client.get_run(parent_id).info.experiment_id
    runs = child_runs(client, experiment_id, proto["sweep_id"])
    stale = mark_stale_runs(client, runs)
    done = finished_by_key(runs)
    todo = [c for c in children if c.key not in done]
    if stale:
        print(f"{stale} runs left running by an interrupted sweep were marked KILLED and run again", flush=True)
    if len(todo) < len(children):
        print(f"{len(children) - len(todo)} runs already finished; {len(todo)} to run", flush=True)
    code = _run_local(a, manifest, todo, done, out)
    _log_overhead(client, parent_id, experiment_id, proto["sweep_id"], started, a.parallel)
    all_done = code == 0
    client.set_terminated(parent_id, status="FINISHED" if all_done else "FAILED")
    if all_done:
        print(f"all runs finished; report: python cli.py compare --experiment {experiment}"
              + (f" --tracking_uri {uri}" if a.tracking_uri else ""))
    return code


def _run_local(a, manifest: dict, todo: list[Child], done: dict, out: Path) -> int:
    from lit.cli import check_config
    from lit.sweep.child import fit_args, run_child
    from lit.sweep.local import run_children

    log_dir, results = out / "logs", {}
    # Every variant with runs to do is built once (model, data, trainer) before any compute is spent:
    # a key or value the recipe rejects ends here, in one line.
    checks, seen = [], set()
    for c in todo:
        if c.variant not in seen:
            seen.add(c.variant)
            checks.append(Child(f"{c.variant}|check", c.variant, "check", c.seed, 0, c.overrides))
    tune = manifest["protocol"]["tune"]
    first_value = tune["values"][0] if tune else None
    outcomes = run_children(checks, lambda c: _check(check_config, fit_args(manifest, c, first_value)), a.parallel,
                            log_dir, lambda c: "ready", lambda msg: None, results)
    for o in outcomes:
        if o.code != 0:
            raise UserInputError(f"variant {o.child.variant}: {_error_line(o.log)}")

    tune_keys: dict[str, list[str]] = {}
    for c in manifest["children"]:
        if c["phase"] == "tune":
            tune_keys.setdefault(c["variant"], []).append(c["key"])

    def gate(child: Child) -> str:
        if child.phase != "seed":
            return "ready"
        codes = [0 if k in done else results.get(k) for k in tune_keys.get(child.variant, [])]
        if any(code not in (None, 0) for code in codes):
            return "blocked"
        return "wait" if None in codes else "ready"

    outcomes = run_children(todo, lambda c: run_child(manifest, c), a.parallel, log_dir, gate,
                            lambda msg: print(msg, flush=True), results)
    failed = [o for o in outcomes if o.code != 0]
    for o in failed:
        why = "not started: its tuning failed" if o.code == -1 else _error_line(o.log)
        print(f"failed: {o.child.key}: {why}", file=sys.stderr)
    user_errors = [o for o in failed if o.code == 2]
    if user_errors:
        raise UserInputError(f"run {user_errors[0].child.key} failed: {_error_line(user_errors[0].log)} "
                             "(finished runs are kept; fix it and rerun the same command)")
    return 1 if failed else 0


def _check(check_config, args: list[str]) -> int:
    check_config(args[1:])  # without the subcommand: build, do not run
    return 0


def _error_line(log: Path | None) -> str:
    """The last ``error:`` line of a child's log (or its last line), without the prefix."""
    if log is None or not log.is_file():
        return "no log"
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    line = (errors or lines or ["(empty log)"])[-1]
    return re.sub(r"^error:\s*", "", line) + ("" if errors else f" (see {log})")


def _log_overhead(client, parent_id: str, experiment_id: str, sweep: str, started: float, parallel: int) -> None:
    """Everything but the children's own training and validation is the sweep's overhead.

    A child's own time is its MLflow run's life (created as fit sets up, ended after the last validation);
    the sweep's wall time counts from the command's start. With ``parallel`` slots, an idle slot (waiting
    for a tuning result, or the tail of the sweep) counts as overhead too.
    """
    from lit.sweep.store import child_runs

    wall = time.time() - started
    mine = [r for r in child_runs(client, experiment_id, sweep)
            if r.info.start_time >= started * 1000 and r.info.end_time and r.info.status == "FINISHED"]
    children_s = sum((r.info.end_time - r.info.start_time) / 1000 for r in mine)
    if not mine:
        return
    overhead = 1 - children_s / (parallel * wall)
    client.log_batch(parent_id, metrics=[_metric(k, v) for k, v in (
        ("sweep/wall_s", wall), ("sweep/children_s", children_s), ("sweep/parallel", parallel),
        ("sweep/runs", len(mine)), ("sweep/overhead_fraction", overhead))])
    print(f"{len(mine)} runs in {wall:.0f} s: {children_s:.0f} s of training and validation on {parallel} "
          f"slot(s); sweep overhead {100 * overhead:.1f}%")


def _metric(key: str, value: float):
    from mlflow.entities import Metric

    return Metric(key, float(value), int(time.time() * 1000), 0)
