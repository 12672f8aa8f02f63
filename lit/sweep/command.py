"""``python cli.py sweep``: variants x seeds (a learning rate tuned per variant), one MLflow parent run.

    python cli.py sweep --config recipes/gpt_baseline.yaml --vary model.arch.norm=rmsnorm,dyt,perinorm \\
        --seeds 3 --tune model.lr=1e-3,3e-3,1e-2 --parallel 2 --trainer.max_steps=300
    python cli.py compare --experiment sweep-gpt_baseline

Options it does not know are ``fit`` options, applied to every run. Rerunning the same command resumes:
children that are done (finished, or diverged: an outcome) are skipped, crashed or killed ones run again;
a sweep whose inputs changed (recipe, config files, code commit) refuses unless ``--new_sweep``; a sweep
that is running refuses a second owner. docs/sweeps.md tells the whole story.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import time
from pathlib import Path

import yaml

from lit.errors import OneLineArgumentParser, UserInputError, one_line_errors
from lit.sweep import ladder, looks, placement
from lit.sweep import protocol as P
from lit.sweep.grid import (
    Child,
    Tuning,
    Variant,
    build_children,
    build_variants,
    find_baseline,
    option_value,
    parse_values,
    sweep_id,
)
from lit.sweep.identity import changes, identity
from lit.tracking.ui import where_to_look

EPILOG = """\
Each run is `cli.py fit --config RECIPE [variant] [fit options] --seed_everything=S --data.seed=S`: seed S is
the init seed and the data order of that run in every variant, so the variants' differences pair by seed; by
default each parameter's init is keyed by its name (--random_numbers), so what two variants share starts equal.
Tuning: each variant tries every --tune value on the tuning seed (--tune_seed, outside the evaluation seeds);
the seeds run at the value with the best final validation --metric, and the tuning runs are not counted.
A run whose loss goes non-finite is recorded as diverged (an outcome: never picked, never rerun); a
variant whose every tuning value diverged is diverged at every value and its seeds do not run.
After training, each run is tested on the data's held-out test split (the report metric, e.g. test/loss).
Runs log to one experiment: a parent run holds the protocol, a child run per (variant, seed) holds the
metrics. Rerunning the command resumes; --add_seeds N extends a sweep. Then: python cli.py compare
--experiment NAME."""

FAR_SEED = 2**31 - 1  # the default tuning seed when the evaluation seeds start at 0
TEST_METRICS = ("loss", "bpb", "acc1", "acc5")  # what the models log in test (test/<name>)


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
    p.add_argument("--seeds", type=int, default=None, help="seeds per variant (default 3; with --looks, the last look)")
    p.add_argument("--seed_base", type=int, default=None,
                   help="first seed (default: the recipe's seed_everything, else 0); seeds are consecutive")
    p.add_argument("--add_seeds", type=int, default=0, metavar="N",
                   help="extend an existing sweep by N paired seeds (it then has --seeds + N); rerunning the "
                        "same command resumes")
    p.add_argument("--tune", metavar="KEY=A,B,C", help="tune this key per variant over these values")
    p.add_argument("--tune_steps", type=int, default=None, help="budget of the tuning runs (default: the full budget)")
    p.add_argument("--tune_seed", type=int, default=None,
                   help="seed of the tuning runs, outside the evaluation seeds (default: seed_base - 1, or "
                        f"{FAR_SEED} when seed_base is 0)")
    p.add_argument("--reuse_tuning_run_as_seed", action="store_true",
                   help="the old rule: tune on the first evaluation seed at the full budget and count the picked "
                        "tuning run as that seed's result (slightly optimistic; recorded as tune.rule)")
    p.add_argument("--shared_value", action="store_true",
                   help="with --tune: also run every variant but the baseline on each evaluation seed at the "
                        "baseline's tuned value, for a secondary comparison at a shared learning rate beside the "
                        "primary one at each variant's own (a variant that picked the baseline's value reuses its "
                        "seed runs); recorded in the protocol as shared_value")
    p.add_argument("--baseline", metavar="KEY=V", help="the variant the others are compared with (default: first)")
    p.add_argument("--metric", default="val/loss", help="the validation metric tuning picks by (default val/loss)")
    p.add_argument("--mode", choices=["min", "max"],
                   help="whether lower or higher --metric is better; required for a metric not known by name")
    p.add_argument("--report_metric",
                   help="the metric compare reports (default: test/<name> of --metric when the data have a test "
                        "split and the model logs it (loss, bpb, acc1), else --metric itself)")
    p.add_argument("--family", help="the multiple-comparison family of this sweep's comparisons (default: "
                                    "the sweep id); sweeps naming one family are corrected together")
    p.add_argument("--equivalence_margin", type=float, default=None, metavar="M",
                   help="test parity claims as equivalence within +-M of the baseline (two one-sided tests)")
    p.add_argument("--equivalent", action="append", default=[], metavar="LABEL",
                   help="a variant whose claim is parity (with --equivalence_margin; default: every variant "
                        "but the baseline)")
    p.add_argument("--random_numbers", choices=["by_name", "construction_order"], default="by_name",
                   help="how each run draws its random numbers: by_name (default: every parameter's init keyed by "
                        "its name, dropout by module and batch, so variants start identical in what they share "
                        "and their seeds pair) or construction_order (the rule of sweeps before it)")
    p.add_argument("--new_sweep", action="store_true",
                   help="start a new sweep even though one of this command exists with other inputs (recipe, "
                        "config files or code commit changed)")
    p.add_argument("--experiment", help="MLflow experiment (default: sweep-<recipe name>)")
    p.add_argument("--tracking_uri", help="MLflow store (default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db)")
    p.add_argument("--parallel", type=placement.parallel_value, default=1, metavar="N|auto",
                   help="runs at once on this machine (local launch); auto: every slot the GPUs hold (GPUs / "
                        "gpus_per_run x runs_per_gpu), on CPU the cores / threads per run ($OMP_NUM_THREADS, else 1)")
    p.add_argument("--gpus_per_run", type=int, default=None, metavar="K",
                   help="GPUs each run trains on (default 1 where there are GPUs): each worker slot gets K of them "
                        "as CUDA_VISIBLE_DEVICES and its runs --trainer.accelerator=gpu --trainer.devices=K")
    p.add_argument("--runs_per_gpu", type=int, default=None, metavar="M",
                   help="small runs sharing each GPU (default 1): M slots per GPU, each waiting for its share of the "
                        "GPU's memory before a run; the sweep says whether CUDA MPS runs")
    p.add_argument("--launch", choices=["local", "slurm"], default="local",
                   help="run here, or write a SLURM job-array script and a manifest instead")
    p.add_argument("--sbatch", action="append", default=[], metavar="OPTION",
                   help="an #SBATCH line for the job arrays, e.g. --sbatch=--gpus-per-task=1 (repeatable)")
    ladder.add_options(p)
    looks.add_options(p)
    p.add_argument("--out", help="folder for the manifest, logs, checkpoints and scripts (default: sweeps/<id>)")
    return p


def recipe_facts(path: Path) -> dict:
    try:
        recipe = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise UserInputError(f"cannot read the recipe {path}: {exc}") from exc
    return recipe if isinstance(recipe, dict) else {}


def resolve_mode(metric: str, mode: str | None) -> str:
    """The direction of ``metric``: as given, or known from its name; an unknown name must be told."""
    if mode is not None:
        return mode
    known = P.known_mode(metric)
    if known is None:
        raise UserInputError(f"--metric {metric} is not a metric known by name; say whether lower or higher is "
                             "better with --mode min or --mode max")
    return known


def default_report_metric(metric: str, has_test_split: bool) -> str:
    prefix, _, name = metric.rpartition("/")
    if has_test_split and prefix == "val" and name in TEST_METRICS:
        return f"test/{name}"
    return metric


def build_protocol(a: argparse.Namespace, fit_options: list[str],
                   measure_fn=None) -> tuple[dict, list[Variant], Tuning | None]:
    """The protocol of the sweep this command describes, before the store is read (seeds: ``--seeds``).

    ``core`` holds what the runs are (its hash finds the sweep again); the rest is checked on resume.
    """
    recipe_path = Path(a.config).resolve()
    if not recipe_path.is_file():
        raise UserInputError(f"recipe {a.config} not found; pass --config recipes/<name>.yaml")
    recipe = recipe_facts(recipe_path)
    bad = [o for o in fit_options if o.startswith("-") and not o.startswith("--")]
    if bad or (fit_options and not fit_options[0].startswith("--")):
        raise UserInputError(f"cannot read {(bad or fit_options)[0]!r}: fit options are --key=value "
                             "(see `python cli.py sweep --help`)")
    sequential = looks.plan_of(a)  # settles a.seeds: with --looks, the last look
    if a.seeds < 1:
        raise UserInputError(f"--seeds must be at least 1, got {a.seeds}")
    if a.add_seeds < 0:
        raise UserInputError(f"--add_seeds must be at least 0, got {a.add_seeds}")
    mode = resolve_mode(a.metric, a.mode)
    variants = build_variants(a.vary, a.variant)
    baseline = find_baseline(variants, a.baseline)
    base = a.seed_base if a.seed_base is not None else recipe.get("seed_everything")
    base = base if isinstance(base, int) and not isinstance(base, bool) else 0
    seeds = [base + i for i in range(a.seeds + a.add_seeds)]
    steps = option_value(fit_options, "trainer.max_steps") or (recipe.get("trainer") or {}).get("max_steps")
    steps = int(steps) if steps not in (None, -1, "-1") else None
    tuning = _tuning(a, seeds, base, steps, variants)
    _check_shared_value(a, variants)
    equivalence = None
    labels = [v.label for v in variants]
    if a.equivalence_margin is not None:
        if not a.equivalence_margin > 0:
            raise UserInputError(f"--equivalence_margin must be positive, got {a.equivalence_margin}")
        unknown = [e for e in a.equivalent if e not in labels]
        if unknown:
            raise UserInputError(f"--equivalent {unknown[0]} is not a variant; use one of: {', '.join(labels)}")
        parity = a.equivalent or [v for v in labels if v != baseline.label]
        equivalence = {"margin": a.equivalence_margin, "variants": parity}
    elif a.equivalent:
        raise UserInputError("--equivalent needs --equivalence_margin M (the margin of the parity claim)")
    tune = None
    if tuning is not None:
        tune = {"key": tuning.key, "values": tuning.values, "steps": tuning.steps, "seed": tuning.seed,
                "reuse_seed_run": tuning.reuse_seed_run, "rule": tuning.rule}
    core = {"recipe": project_path(recipe_path),
            "variants": [{"label": v.label, "overrides": v.overrides} for v in variants],
            "baseline": baseline.label, "seed_base": base, "metric": a.metric, "mode": mode, "tune": tune,
            "fit_args": fit_options, "steps": steps, "report_metric": a.report_metric}
    if a.random_numbers != "construction_order":  # absent: the rule of sweeps written before it, whose ids stand
        core["random_numbers"] = a.random_numbers
    if a.shared_value:  # absent, not false, without it: the ids of sweeps written before it stand
        core["shared_value"] = True
    rungs = ladder.plan(a, fit_options, str(recipe_path), variants, baseline, measure_fn)
    if rungs is not None:  # absent, not null, outside a ladder: the ids of sweeps written before ladders stand
        core["ladder"] = rungs
    if sequential is not None:  # absent outside a sequential plan, like "ladder"
        core["sequential"] = sequential
    proto = {**core, "seeds": seeds, "family": a.family, "equivalence": equivalence,
             "identity": identity(recipe_path, variants)}
    if tune is not None:
        proto["tune"] = {**tune, "description": tuning.description}
    return proto, variants, tuning


def project_root(recipe_path: Path) -> Path | None:
    """The project a recipe belongs to: the nearest folder above it holding ``.git``, else the folder the command
    runs in (where ``mlflow.db`` and ``sweeps/`` land by default) if the recipe is inside it, else None."""
    for folder in recipe_path.parents:
        if (folder / ".git").exists():
            return folder
    cwd = Path.cwd().resolve()
    return cwd if recipe_path.is_relative_to(cwd) else None


def project_path(recipe_path: Path) -> str:
    """The recipe as the sweep's identity names it: relative to its project, so a moved or re-cloned checkout is
    the same sweep; absolute only for a recipe outside any project (it did not move with one)."""
    root = project_root(recipe_path)
    return recipe_path.relative_to(root).as_posix() if root is not None else str(recipe_path)


def find_sweep(client, experiment_id: str, core: dict, recipe_path: Path):
    """The newest parent of the sweep ``core`` describes, and its lineage: under today's rule (the recipe by its
    project path), else under the rule of sweeps started before it, whose lineage hashed the recipe's absolute
    path at the time, wherever the project then was (its ``sweep.recipe`` param ends in the same project path)."""
    from lit.sweep.store import LINEAGE, find_parent, search_all_runs

    lineage = sweep_id(core)
    parent = find_parent(client, experiment_id, lineage)
    if parent is not None:
        return parent, lineage
    tail = Path(core["recipe"]).parts
    old_rule = []
    for run in search_all_runs(client, experiment_id, f"tags.`{P.ROLE}` = '{P.PARENT}'"):
        old_path = run.data.params.get("sweep.recipe", "")
        if not old_path.startswith("/") or Path(old_path).parts[-len(tail):] != tail:
            continue
        if run.data.tags.get(LINEAGE) == sweep_id({**core, "recipe": old_path}):
            old_rule.append(run)
    if not old_rule:
        return None, lineage
    newest = max(old_rule, key=lambda r: r.info.start_time)
    return newest, newest.data.tags[LINEAGE]


def _check_shared_value(a: argparse.Namespace, variants: list[Variant]) -> None:
    """``--shared_value`` is refused, in one line, where it has no meaning or this sweep cannot keep it."""
    if not a.shared_value:
        return
    if a.reuse_tuning_run_as_seed:
        raise UserInputError("--shared_value with --reuse_tuning_run_as_seed: the old rule counts a tuning run as a "
                             "seed result, and the runs at the baseline's value are built for the separate tuning "
                             "seed; drop one of them")
    if a.looks is not None:
        raise UserInputError("--shared_value with --looks: a sequential sweep decides its looks on the primary "
                             "comparison only and would leave the runs at the baseline's value unplanned; drop one "
                             "of them")
    if len(variants) < 2:
        raise UserInputError("--shared_value needs a variant besides the baseline: it runs the other variants at "
                             "the baseline's tuned value")


def _tuning(a: argparse.Namespace, seeds: list[int], base: int, steps: int | None, variants) -> Tuning | None:
    if not a.tune:
        for option, given in (("--tune_steps", a.tune_steps is not None), ("--tune_seed", a.tune_seed is not None),
                              ("--reuse_tuning_run_as_seed", a.reuse_tuning_run_as_seed),
                              ("--shared_value", a.shared_value)):
            if given:
                raise UserInputError(f"{option} needs --tune KEY=A,B,C")
        return None
    key, values = parse_values(a.tune, "--tune")
    if any(key in v.overrides for v in variants):
        raise UserInputError(f"{key} is both varied and tuned; tune it or vary it")
    if len(values) < 2:
        raise UserInputError(f"--tune {a.tune} has one value: nothing to pick from; give two or more")
    if a.tune_steps is not None and a.tune_steps < 1:
        raise UserInputError(f"--tune_steps must be at least 1, got {a.tune_steps}")
    short = a.tune_steps if a.tune_steps is not None and a.tune_steps != steps else None
    if a.reuse_tuning_run_as_seed:
        if short is not None:
            raise UserInputError("--reuse_tuning_run_as_seed needs tuning runs at the full budget; drop --tune_steps")
        if a.tune_seed is not None and a.tune_seed != seeds[0]:
            raise UserInputError("--reuse_tuning_run_as_seed tunes on the first evaluation seed; drop --tune_seed")
        return Tuning(key, values, None, seeds[0], reuse_seed_run=True)
    tune_seed = a.tune_seed if a.tune_seed is not None else (base - 1 if base > 0 else FAR_SEED)
    if not 0 <= tune_seed <= 2**32 - 1:
        raise UserInputError(f"--tune_seed must be in [0, 2**32 - 1], got {tune_seed}")
    if tune_seed in seeds:
        raise UserInputError(f"--tune_seed {tune_seed} is one of the evaluation seeds {seeds[0]}..{seeds[-1]}; "
                             "pick a seed outside them (or ask for the old rule with --reuse_tuning_run_as_seed)")
    return Tuning(key, values, short, tune_seed, reuse_seed_run=False)


def _placement(a: argparse.Namespace, fit_options: list[str], rungs: dict | None = None) -> placement.Layout:
    """Where the runs compute (``lit/sweep/placement.py``); one line for a layout that cannot be."""
    rung_gpus = ladder.rung_gpus(rungs)
    if a.launch == "slurm" and any(rung_gpus):
        raise UserInputError("--ladder rungs with their own gpus_per_run and --launch slurm: an array task runs one "
                             "child on the GPUs its array asks for; drop gpus_per_run from the rungs, or launch "
                             "locally")
    if a.launch == "slurm":  # one run per array task: SLURM places it; the runs are told their GPUs per run
        if a.runs_per_gpu is not None:
            raise UserInputError("--runs_per_gpu with --launch slurm: an array task runs one run; share GPUs through "
                                 "SLURM (e.g. --sbatch=--gpus-per-task=1 with MPS or sharding), or launch locally")
        check = placement.cpu_layout(a.parallel if isinstance(a.parallel, int) else 1)  # where the variants are built
        layout = placement.Layout(check.slots, a.gpus_per_run or 0, 1)
    else:
        layout = placement.plan(a.parallel, a.gpus_per_run, a.runs_per_gpu, fit_options, rung_gpus=rung_gpus)
    if a.launch == "slurm" and layout.gpus_per_run > 1:
        raise UserInputError(f"--gpus_per_run {layout.gpus_per_run} with --launch slurm: Lightning under SLURM wants "
                             "one task per rank, and an array task runs one child; use --gpus_per_run 1 there, or "
                             "launch locally on a node (its slots then hold the GPUs)")
    return layout


@one_line_errors
def main(argv: list[str]) -> int:
    started = time.time()
    try:
        a, fit_options = parser().parse_known_args(argv)
        code = _sweep(a, fit_options, started)
        while code == looks.NEXT_LOOK:  # a sequential sweep run here: the look just run is decided, then the next
            code = _sweep(a, fit_options, started)
        return code
    except KeyboardInterrupt:
        sys.stderr.write("interrupted: rerun the same command to resume (finished runs are kept)\n")
        return 130


class Stopped(KeyboardInterrupt):
    """The sweep process got SIGTERM or SIGHUP: stop its runs, end the parent KILLED."""


def _stop_on_signal(signum, frame):
    raise Stopped(signal.Signals(signum).name)


def _resume(client, parent, proto: dict, a: argparse.Namespace) -> tuple[dict, list[int]]:
    """The stored protocol of the sweep being resumed, checked against this command's (one line if refused)."""
    from lit.sweep.ownership import describe_owner, owner_alive
    from lit.sweep.store import read_protocol

    stored = read_protocol(client, parent.info.run_id)
    name = f"sweep {stored['sweep_id']}"
    if parent.info.status == "RUNNING" and owner_alive(parent.data.tags):
        raise UserInputError(f"{name} is already running: {describe_owner(parent.data.tags)}; wait for it to end "
                             "(or stop that process), then rerun this command to resume")
    changed = changes(stored.get("identity"), proto["identity"])
    if (proto["family"] or stored["sweep_id"]) != stored.get("family"):
        changed.append("--family")
    if proto["equivalence"] != stored.get("equivalence"):
        changed.append("--equivalence_margin/--equivalent")
    if changed:
        raise UserInputError(f"{name} was started with other inputs: {', '.join(changed)} changed since; pass "
                             "--new_sweep to start a new sweep, or restore them to resume it")
    have, want = stored["seeds"], proto["seeds"]
    if want != have[:len(want)] and have != want[:len(have)]:
        raise UserInputError(f"{name} runs seeds {have[0]}..{have[-1]}; these seeds do not extend them")
    if len(want) < len(have):
        raise UserInputError(f"{name} has {len(have)} seeds ({have[0]}..{have[-1]}); rerun with --seeds "
                             f"{len(have)} (or --seeds {a.seeds} --add_seeds {len(have) - a.seeds}) to resume it")
    if len(want) > len(have) and not a.add_seeds:
        raise UserInputError(f"{name} has {len(have)} seeds; to extend it, say so: --seeds {len(have)} "
                             f"--add_seeds {len(want) - len(have)}")
    if stored.get("tune") and stored["tune"]["seed"] in want:
        raise UserInputError(f"seed {stored['tune']['seed']} is {name}'s tuning seed; it cannot also be an "
                             "evaluation seed (pass --tune_seed elsewhere with --new_sweep)")
    return {**stored, "seeds": want}, have


def _sweep(a: argparse.Namespace, fit_options: list[str], started: float) -> int:
    from mlflow import MlflowClient

    from lit.sweep.ownership import describe_owner, owner_tags
    from lit.sweep.store import (
        child_runs,
        create_parent,
        done_by_key,
        experiment_id_for,
        find_parent,
        follow_moved_store,
        parents_in_lineage,
        settle_unfinished_runs,
        write_protocol,
    )
    from lit.tracking.uri import resolve_tracking_uri, sqlite_creation_lock

    proto, variants, tuning = build_protocol(a, fit_options)
    layout = _placement(a, fit_options, proto.get("ladder"))
    core = {k: proto[k] for k in CORE_FIELDS if k in proto}
    core["tune"] = None if proto["tune"] is None else {k: v for k, v in proto["tune"].items() if k != "description"}
    recipe_path = Path(a.config).resolve()
    experiment = a.experiment or f"sweep-{Path(a.config).stem}"
    uri = resolve_tracking_uri(a.tracking_uri)
    with sqlite_creation_lock(uri):
        client = MlflowClient(uri)
        experiment_id = experiment_id_for(client, experiment, create=True)
        moved_to = follow_moved_store(client, experiment_id)
    if moved_to is not None:
        print(f"the project moved: experiment {experiment!r}'s artifacts are now read from {moved_to}", flush=True)
    parent, lineage = find_sweep(client, experiment_id, core, recipe_path)
    if parent is not None and not a.new_sweep:
        proto, stored_seeds = _resume(client, parent, proto, a)
        extended = len(proto["seeds"]) > len(stored_seeds)
    else:
        if a.add_seeds:
            raise UserInputError("--add_seeds extends an existing sweep, and none matches this command; run it "
                                 "without --add_seeds (and with --seeds N) to start one")
        if parent is not None and parent.info.status == "RUNNING":
            from lit.sweep.ownership import owner_alive

            if owner_alive(parent.data.tags):
                raise UserInputError(f"sweep {parent.data.tags.get(P.SWEEP_ID)} is running "
                                     f"({describe_owner(parent.data.tags)}); let it end before starting a new one")
        lineage = sweep_id(core)  # a new sweep is always of today's rule, even beside one found by the old rule
        generation = parents_in_lineage(client, experiment_id, lineage) if parent is not None else 0
        hashed = {k: v for k, v in proto["identity"].items() if k != "dirty"}
        proto = {**proto, "sweep_id": sweep_id({**core, "identity": hashed, "generation": generation})}
        proto["family"] = proto["family"] or proto["sweep_id"]
        parent, extended, stored_seeds = None, False, []
    shared_with = proto["baseline"] if proto.get("shared_value") else None
    children = ladder.expand(build_children(variants, proto["seeds"], tuning, shared_with), proto.get("ladder"))
    # A sequential sweep first decides every look whose runs are done, then runs only the next look's seeds.
    look = looks.advance(client, experiment_id, parent, proto, children) if proto.get("sequential") else None
    if look is not None:
        children = look.children
    runs = child_runs(client, experiment_id, proto["sweep_id"]) if parent is not None else []
    stale, live = settle_unfinished_runs(client, runs)
    done = done_by_key(runs)
    todo = [c for c in children if c.key not in done and c.key not in live]
    out = Path(a.out or Path("sweeps") / proto["sweep_id"][:8]).resolve()
    out.mkdir(parents=True, exist_ok=True)
    manifest = {"protocol": proto, "experiment": experiment, "tracking_uri": uri, "parent_run_id": None,
                "recipe": str(recipe_path), "fit_args": proto["fit_args"], "save_dir": str(out / "runs"),
                "placement": [] if a.launch == "slurm" else layout.trainer_args(proto["fit_args"]),
                "children": [c.to_json() for c in children]}
    # Every variant with runs to do is built once (model, data, trainer) before any compute is spent:
    # a key or value the recipe rejects ends here, in one line, before a parent run exists.
    checked = [] if look is not None and look.look > 1 else todo if parent is not None else children  # once
    tested = _check_variants(layout, manifest, checked, out / "logs")
    # A SLURM sweep's variants are checked where it is submitted (a login node may have no GPU); its tasks get theirs.
    manifest["placement"] = layout.trainer_args(proto["fit_args"])
    if parent is None:
        if proto["report_metric"] is None:
            if len(set(tested.values())) > 1:
                raise UserInputError("some variants' data have a test split and some do not: "
                                     f"{', '.join(f'{k}: {v}' for k, v in tested.items())}; pass --report_metric")
            proto["report_metric"] = default_report_metric(proto["metric"], all(tested.values()))
        missing = [v for v, has in tested.items() if not has]
        if proto["report_metric"].startswith("test/") and missing:
            raise UserInputError(f"--report_metric {proto['report_metric']} needs a test split, and the data of "
                                 f"variant {missing[0]} have none; report on validation (--report_metric "
                                 f"{proto['metric']}) or use data with a test split")
        parent_id = create_parent(client, experiment_id, proto, lineage, owner_tags())
        first = find_parent(client, experiment_id, lineage, oldest=True, sweep=proto["sweep_id"])
        if first is not None and first.info.run_id != parent_id:  # two commands started it at once
            client.delete_run(parent_id)
            raise UserInputError(f"sweep {proto['sweep_id']} was started at the same moment by another command "
                                 f"({describe_owner(first.data.tags)}); it runs there")
    else:
        parent_id = parent.info.run_id
        client.update_run(parent_id, status="RUNNING")
        client.log_batch(parent_id, tags=[_tag(k, v) for k, v in owner_tags().items()])
        if extended:
            write_protocol(client, parent_id, proto)
            _warn_interim_look(client, parent_id, proto["sweep_id"], len(stored_seeds), len(proto["seeds"]))
    manifest["parent_run_id"] = parent_id
    scripts = look.folder(out) if look is not None else out  # each look has its own manifest and job arrays
    manifest_path = scripts / "manifest.json"
    if look is None or not look.finished:  # a settled sequential sweep has no runs left to describe
        scripts.mkdir(parents=True, exist_ok=True)
        manifest_path.write_text(json.dumps(manifest, indent=1))
    n_variants, n_tune = len(proto["variants"]), sum(c.phase == "tune" for c in children)
    n_shared = sum(c.phase == P.SHARED_PHASE for c in children)
    what = "new" if parent is None else (f"extended from {len(stored_seeds)} seeds" if extended else "resumed")
    print(f"sweep {proto['sweep_id']} ({what}): {n_variants} variants x {len(proto['seeds'])} seeds"
          + (f" x {len(proto['ladder']['rungs'])} rungs" if proto.get("ladder") else "")
          + (f", {n_tune} tuning runs" if n_tune else "")
          + (f", {n_shared} runs at the baseline's tuned value" if n_shared else "")
          + f"; parent run {parent_id} in experiment "
          f"{experiment!r} ({uri}); reports {proto['report_metric']}" + (look.describe() if look else ""),
          flush=True)
    for line in look.recorded if look else ():
        print(line, flush=True)
    if look is not None and look.finished:
        client.set_terminated(parent_id, status="FINISHED")
        print(f"report: python cli.py compare --experiment {experiment}"
              + (f" --tracking_uri {uri}" if a.tracking_uri else ""))
        print(f"sweep {where_to_look(uri, experiment_id, parent_id)}")
        return 0
    if a.launch == "slurm":
        from lit.sweep.slurm import write_scripts

        submit = write_scripts(manifest, manifest_path, scripts, a.sbatch, layout.gpus_per_run)
        client.set_tag(parent_id, LAUNCHED, "slurm")
        client.set_terminated(parent_id, status="FINISHED")  # the launch is done; each child has its own status
        print(f"wrote {manifest_path} and the job arrays; submit with: bash {submit}"
              + (f"; once they have run, rerun this command to decide look {look.look}" if look else ""))
        print(f"sweep {where_to_look(uri, experiment_id, parent_id)}")
        return 0
    if stale:
        print(f"{stale} runs left unfinished by an interrupted sweep were marked KILLED and run again", flush=True)
    if live:
        print(f"{len(live)} runs are being run by another process and are left to it: {', '.join(sorted(live))}",
              flush=True)
    if len(todo) < len(children):
        print(f"{len(children) - len(todo)} runs already finished; {len(todo)} to run", flush=True)
    print(f"placement: {layout.describe()}", flush=True)
    if layout.runs_per_gpu > 1:
        print(placement.mps_state(), flush=True)
    status, code = "FAILED", 1
    previous = {sig: signal.signal(sig, _stop_on_signal) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        code = _run_local(layout, manifest, todo, done, live, out, client, parent_id)
        status = "FINISHED" if code == 0 else "FAILED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        try:
            # A run whose process ended without closing it (stopped while it was being built, or crashed
            # hard) is not left RUNNING: its owner is gone.
            settle_unfinished_runs(client, child_runs(client, experiment_id, proto["sweep_id"]))
            _log_overhead(client, parent_id, experiment_id, proto["sweep_id"], started, layout.parallel)
        finally:
            client.set_terminated(parent_id, status=status)
    if code == 0 and look is not None:
        return looks.NEXT_LOOK
    if code == 0:
        print(f"all runs finished; report: python cli.py compare --experiment {experiment}"
              + (f" --tracking_uri {uri}" if a.tracking_uri else ""))
    print(f"sweep {where_to_look(uri, experiment_id, parent_id)}")
    return code


def _warn_interim_look(client, parent_id: str, sweep: str, before: int, after: int) -> None:
    """``--add_seeds`` outside a sequential plan: the verdicts read before are an interim look. One line, and a
    record under the parent run that is never overwritten (``lit/sweep/history.py``)."""
    from lit.sweep.history import write_extension

    record = write_extension(client, parent_id, before, after)
    sys.stderr.write(f"warning: sweep {sweep} extended from {before} to {after} seeds outside a sequential plan: "
                     f"verdicts read at {before} seeds were an interim look, so those at {after} are not at the "
                     "report's alpha (plan looks with --looks); recorded as extensions/extension_"
                     f"{record['index']}.json\n")


CORE_FIELDS = ("recipe", "variants", "baseline", "seed_base", "metric", "mode", "tune", "fit_args", "steps",
               "report_metric", "ladder", "random_numbers", "sequential", "shared_value")
LAUNCHED = P.PREFIX + "launched"


def _tag(key: str, value: str):
    from mlflow.entities import RunTag

    return RunTag(key, value)


def _check_variants(layout, manifest: dict, todo: list[Child], log_dir: Path) -> dict[str, bool]:
    """Build each variant of ``todo`` once, in a fork; returns whether each one's data have a test split."""
    from lit.cli import check_config
    from lit.sweep.child import fit_args
    from lit.sweep.local import run_children

    checks, seen = [], set()
    for c in todo:
        if c.variant not in seen:
            seen.add(c.variant)
            checks.append(Child(f"{c.variant}|check", c.variant, "check", c.seed, 0, c.overrides))
    tune = manifest["protocol"]["tune"]
    first_value = tune["values"][0] if tune else None
    outcomes = run_children(checks, lambda c: _check(check_config, fit_args(manifest, c, first_value)), layout,
                            log_dir, lambda c: "ready", lambda msg: None, {})
    for o in outcomes:
        if o.code not in (HAS_TEST_SPLIT, NO_TEST_SPLIT):
            raise UserInputError(f"variant {o.child.variant}: {_error_line(o.log)}")
    return {o.child.variant: o.code == HAS_TEST_SPLIT for o in outcomes}


def _run_local(layout, manifest: dict, todo: list[Child], done: dict, live: dict, out: Path, client,
               parent_id: str) -> int:
    from lit.sweep.child import ALL_DIVERGED_EXIT, DIVERGED_EXIT, OWNED_ELSEWHERE_EXIT, run_child
    from lit.sweep.local import run_children
    from lit.sweep.ownership import BEAT_S, beat_now

    log_dir, results = out / "logs", {}
    tune_keys: dict[str, list[str]] = {}
    seed_keys: dict[tuple[str, int], str] = {}
    for c in manifest["children"]:
        if c["phase"] == "tune":
            tune_keys.setdefault(c["variant"], []).append(c["key"])
        elif c["phase"] == P.SEED_PHASE:
            seed_keys[(c["variant"], c["seed"])] = c["key"]
    baseline = manifest["protocol"]["baseline"]

    def needs(child: Child) -> list[str]:
        """The runs a child reads in the store when it starts: its variant's tuning (a seed run's value); and for a
        run at the baseline's value the baseline's tuning too, and its own variant's seed run at that seed (which
        it reuses when both picked the same value)."""
        if child.phase == P.SEED_PHASE:
            return tune_keys.get(child.variant, [])
        if child.phase == P.SHARED_PHASE:
            own = seed_keys.get((child.variant, child.seed))
            return tune_keys.get(child.variant, []) + tune_keys.get(baseline, []) + ([own] if own else [])
        return []

    def gate(child: Child) -> str:
        codes = [0 if k in done else (OWNED_ELSEWHERE_EXIT if k in live else results.get(k)) for k in needs(child)]
        if any(code not in (None, 0, DIVERGED_EXIT, ALL_DIVERGED_EXIT) for code in codes):
            return "blocked"
        return "wait" if None in codes else "ready"

    last_beat = [time.monotonic()]

    def tick() -> None:  # the parent's heartbeat, from this loop: this process forks, so it runs no threads
        if time.monotonic() - last_beat[0] >= BEAT_S:
            last_beat[0] = time.monotonic()
            beat_now(client, parent_id)

    def report(msg: str) -> None:
        print(msg, flush=True)

    outcomes = run_children(todo, lambda c: run_child(manifest, c), layout, log_dir, gate, report, results,
                            tick=tick)
    diverged = [o for o in outcomes if o.code == DIVERGED_EXIT]
    skipped = sorted({o.child.variant for o in outcomes if o.code == ALL_DIVERGED_EXIT
                      and o.child.phase == P.SEED_PHASE})
    if diverged:
        print(f"{len(diverged)} runs diverged (recorded as such, not rerun): "
              f"{', '.join(o.child.key for o in diverged)}")
    for variant in skipped:
        print(f"variant {variant}: every tuning value diverged; its seeds were not run")
    failed = [o for o in outcomes if o.code not in (0, DIVERGED_EXIT, ALL_DIVERGED_EXIT)]
    for o in failed:
        why = ("not started: a run it waits for (its tuning, or its seed run) did not finish here" if o.code == -1 else
               "another process started it first" if o.code == OWNED_ELSEWHERE_EXIT else _error_line(o.log))
        print(f"failed: {o.child.key}: {why}", file=sys.stderr)
    user_errors = [o for o in failed if o.code == 2]
    if user_errors:
        raise UserInputError(f"run {user_errors[0].child.key} failed: {_error_line(user_errors[0].log)} "
                             "(finished runs are kept; fix it and rerun the same command)")
    return 1 if failed or live else 0


HAS_TEST_SPLIT, NO_TEST_SPLIT = 0, 4  # exit codes of a variant's check


def _check(check_config, args: list[str]) -> int:
    cli = check_config(args[1:])  # without the subcommand: build, do not run
    return HAS_TEST_SPLIT if getattr(cli.datamodule, "has_test_split", False) else NO_TEST_SPLIT


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
