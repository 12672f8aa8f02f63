"""One child run of a sweep: its ``fit`` command line, and running it in this process.

The same function runs a child whether a local sweep forked it or a SLURM array task started it
(``python -m lit.sweep.child MANIFEST PHASE INDEX``), so both log the same run into the same store.
A seed run of a tuned variant looks up the tuned value in the store when it starts (the tuning runs
may have run on other machines), and a seed run that reuses the tuning run only tags it. A run at the
baseline's value (``--shared_value``) looks up the baseline's pick the same way; when its variant picked that
value too, its seed run at that seed is that run already, and it only tags it.

The child claims its run before training: it creates the MLflow run with its owner and a heartbeat
(``lit/sweep/ownership.py``), and gives way if another live process holds the same child. After
``fit`` it tests the final weights (last, not best) on the data's test split when the protocol reports
a test metric, then tags the outcome. A loss that goes non-finite is an outcome too: the run ends
FAILED, tagged diverged at its first non-finite step, with the metrics of the steps before it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from lit.errors import UserInputError, find_cause, report
from lit.sweep import protocol as P
from lit.sweep.grid import CONFIG_KEY, Child
from lit.sweep.ladder import rung_tags

DIVERGED_EXIT = 3  # the run diverged: recorded as its outcome, never rerun
ALL_DIVERGED_EXIT = 4  # a seed run not started: every tuning value of its variant diverged
OWNED_ELSEWHERE_EXIT = 5  # another live process holds this child: not run a second time

# Quiet children by default (their output goes to a log file each); a fit option given to the sweep wins.
# No sanity validation: the sweep built every variant, data included, before any run, and a child validates
# on its schedule anyway; the two batches only cost time (they draw no random number a run uses, so every
# run's numbers are unchanged).
CHILD_DEFAULTS = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
                  "--trainer.num_sanity_val_steps=0"]


def fit_args(manifest: dict, child: Child, tune_value: str | None) -> list[str]:
    """The ``cli.py fit`` arguments of a child run.

    Order matters (later wins): the recipe, the variant's extra YAML files, the devices placement gives each run
    (``lit/sweep/placement.py``), the sweep's fit options, the variant's values, the tuned value, then what the sweep
    owns (seeds, budget, where it logs).
    """
    overrides = dict(child.overrides)
    tune = manifest["protocol"]["tune"]
    if child.phase in (P.SEED_PHASE, P.SHARED_PHASE) and tune is not None:
        overrides[tune["key"]] = tune_value
    configs = [v for k, v in overrides.items() if k == CONFIG_KEY]
    tags = child_tags(manifest, child, tune_value)
    args = ["fit", "--config", manifest["recipe"]]
    for config in configs:
        args += ["--config", config]
    args += CHILD_DEFAULTS + list(manifest.get("placement", [])) + list(manifest["fit_args"])
    args += [f"--{k}={v}" for k, v in overrides.items() if k != CONFIG_KEY]
    args += [f"--seed_everything={child.seed}", f"--data.seed={child.seed}"]
    if manifest["protocol"].get("random_numbers"):
        args.append(f"--model.random_numbers={manifest['protocol']['random_numbers']}")
    if child.steps is not None:
        args.append(f"--trainer.max_steps={child.steps}")
    logger = "--trainer.logger.init_args."
    args += [f"{logger}experiment_name={manifest['experiment']}", f"{logger}tracking_uri={manifest['tracking_uri']}",
             f"{logger}run_name={run_name(child)}", f"{logger}tags={json.dumps(tags)}",
             f"{logger}save_dir={manifest['save_dir']}"]
    return args


def child_tags(manifest: dict, child: Child, tune_value: str | None) -> dict[str, str]:
    tune = manifest["protocol"]["tune"]
    tags = {P.PARENT_RUN: str(manifest["parent_run_id"]), P.ROLE: P.CHILD,
            P.SWEEP_ID: manifest["protocol"]["sweep_id"], P.VARIANT: child.variant, P.SEED: str(child.seed),
            P.SEED_INDEX: str(child.seed_index), P.PHASE: child.phase, P.CHILD_KEY: child.key}
    if tune is not None:
        tags[P.TUNE_KEY] = tune["key"]
        tags[P.TUNE_VALUE] = str(child.tune_value if child.phase == "tune" else tune_value)
    if child.phase == "seed":
        tags[P.FINAL] = P.TRUE
    if child.phase == P.SHARED_PHASE:  # a secondary result: never FINAL, the primary comparison does not see it
        tags[P.SHARED_VALUE] = P.TRUE
    tags.update(rung_tags(manifest, child))
    return tags


def run_name(child: Child) -> str:
    rung = f"rung {child.rung} | " if child.rung is not None else ""
    what = {"tune": f"tune {child.tune_value}", "seed": f"seed {child.seed}",
            P.SHARED_PHASE: f"seed {child.seed} at the baseline's value"}.get(child.phase,
                                                                            f"{child.phase} {child.tune_value}")
    return f"{child.variant} | {rung}{what}"


def run_child(manifest: dict, child: Child) -> int:
    """Run one child in this process; returns an exit code (0 done, 2 a user error, 1 a crash, or one of
    ``DIVERGED_EXIT``, ``ALL_DIVERGED_EXIT``, ``OWNED_ELSEWHERE_EXIT``)."""
    from mlflow import MlflowClient

    from lit.sweep.ownership import Heartbeat
    from lit.sweep.store import AllTuningDiverged, experiment_id_for, pick_tuned_value, same_value

    proto = manifest["protocol"]
    client = MlflowClient(manifest["tracking_uri"])
    tune_value = None
    try:
        experiment_id = experiment_id_for(client, manifest["experiment"])
        if child.phase in (P.SEED_PHASE, P.SHARED_PHASE) and proto["tune"] is not None:
            try:
                tune_value, tuning_run = pick_tuned_value(client, experiment_id, proto["sweep_id"], child.variant,
                                                          proto["tune"]["values"], proto["metric"], proto["mode"])
            except AllTuningDiverged as exc:
                print(f"{child.key}: not run: {exc}")
                return ALL_DIVERGED_EXIT
            if child.phase == P.SHARED_PHASE:
                try:
                    shared, _ = pick_tuned_value(client, experiment_id, proto["sweep_id"], proto["baseline"],
                                                 proto["tune"]["values"], proto["metric"], proto["mode"])
                except AllTuningDiverged as exc:
                    print(f"{child.key}: not run: the baseline has no tuned value: {exc}")
                    return ALL_DIVERGED_EXIT
                if same_value(tune_value, shared):
                    return reuse_seed_run(client, experiment_id, proto["sweep_id"], child, shared)
                tune_value = shared
            if child.reuse:
                # The tuning run at the picked value ran this very seed at the full budget: it is the seed run.
                client.set_tag(tuning_run.info.run_id, P.FINAL, P.TRUE)
                return 0
    except UserInputError as exc:
        return report(exc)
    run_id = claim(client, experiment_id, manifest, child, tune_value)
    if run_id is None:
        return OWNED_ELSEWHERE_EXIT
    beat = Heartbeat(client, run_id).start()
    try:
        # Tuning reads validation only; a tuning run is tested when the old rule may count it as a result.
        counts = (child.phase in (P.SEED_PHASE, P.SHARED_PHASE)
                  or bool(proto["tune"] and proto["tune"]["reuse_seed_run"]))
        return _fit_and_test(manifest, fit_args(manifest, child, tune_value), client, run_id, test=counts)
    finally:
        beat.stop()


def reuse_seed_run(client, experiment_id: str, sweep: str, child: Child, value: str) -> int:
    """A variant that picked the baseline's value: its seed run at this seed already ran at that value, with this
    seed's init and data order. Tag it as the variant's run at the baseline's value instead of training the same
    run again (rerunning it would add only nondeterminism). It must be done: the local gate and the SLURM
    dependency start this child after the seed runs."""
    from lit.sweep.store import child_runs, outcome

    runs = [r for r in child_runs(client, experiment_id, sweep)
            if r.data.tags.get(P.VARIANT) == child.variant and r.data.tags.get(P.SEED) == str(child.seed)
            and P.is_true(r.data.tags.get(P.FINAL)) and outcome(r) is not None]
    if not runs:
        sys.stderr.write(f"error: {child.key}: {child.variant} picked the baseline's value {value}, so its seed run "
                         f"at seed {child.seed} is reused, and it has not finished; run it, then rerun this one\n")
        return 1
    run = max(runs, key=lambda r: r.info.start_time)
    from mlflow.entities import RunTag

    client.log_batch(run.info.run_id, tags=[RunTag(P.SHARED_VALUE, P.TRUE), RunTag(P.REUSED_AS, child.key)])
    print(f"{child.key}: {child.variant} picked the baseline's value {value} too: its seed run {run.info.run_id} is "
          "its run at the baseline's value (tagged, not trained again)")
    return 0


def claim(client, experiment_id: str, manifest: dict, child: Child, tune_value: str | None) -> str | None:
    """Create this child's run, owned by this process; None if another live process holds the child.

    Two processes that start the same child at once both create a run; the earlier one (by start time,
    then run id) keeps the child and the other deletes its own and gives way.
    """
    from lit.sweep.ownership import describe_owner, owner_alive, owner_tags
    from lit.sweep.store import child_runs

    def holders() -> list:
        return [r for r in child_runs(client, experiment_id, manifest["protocol"]["sweep_id"])
                if r.data.tags.get(P.CHILD_KEY) == child.key and r.info.status == "RUNNING"
                and owner_alive(r.data.tags)]

    held = holders()
    if held:
        print(f"{child.key}: already being run by {describe_owner(held[0].data.tags)}; not run a second time")
        return None
    run = client.create_run(experiment_id, run_name=run_name(child),
                            tags={**child_tags(manifest, child, tune_value), **owner_tags()})
    mine = (run.info.start_time, run.info.run_id)
    earlier = [r for r in holders() if (r.info.start_time, r.info.run_id) < mine]
    if earlier:
        client.delete_run(run.info.run_id)
        print(f"{child.key}: started at the same time by {describe_owner(earlier[0].data.tags)}; left to it")
        return None
    return run.info.run_id


def _fit_and_test(manifest: dict, args: list[str], client, run_id: str, test: bool) -> int:
    from lit.cli import main as cli_main
    from lit.sweep import compile_cache
    from lit.sweep.ranks import other_ranks_run

    compile_cache.use(Path(manifest["save_dir"]).parent)  # the sweep's folder: its children share compiled graphs
    proto = manifest["protocol"]
    report = proto.get("report_metric") or proto["metric"]
    tested = test and report.startswith("test/")
    args = args + [f"--trainer.logger.init_args.run_id={run_id}"]
    try:
        with other_ranks_run(args, tested):  # a run on several devices: its other ranks run this child's fit
            cli = cli_main(args)
    except SystemExit as exc:
        diverged = _divergence(exc)
        if diverged is None:
            return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        from mlflow.entities import RunTag

        client.log_batch(run_id, tags=[RunTag(P.OUTCOME, P.DIVERGED_OUTCOME),
                                       RunTag(P.DIVERGED_STEP, str(diverged.step))])
        client.set_terminated(run_id, status="FAILED")
        print(f"diverged at step {diverged.step}: recorded as this run's outcome (FAILED, {P.OUTCOME}=diverged)")
        return DIVERGED_EXIT
    if tested:
        # Training is over but the result is not: the run shows it running until the test is logged.
        client.update_run(run_id, status="RUNNING")
        cli.trainer.test(cli.model, datamodule=cli.datamodule, verbose=False)  # the final weights, not the best
        if not client.get_metric_history(run_id, report):
            sys.stderr.write(f"error: the test logged no {report}; the sweep reports it\n")
            client.set_terminated(run_id, status="FAILED")
            return 1
    client.set_tag(run_id, P.OUTCOME, P.FINISHED_OUTCOME)
    client.set_terminated(run_id, status="FINISHED")
    return 0


def _divergence(exc: BaseException):
    """The ``NonFiniteLossError`` behind a fit that exited (the CLI turns it into one line and an exit)."""
    from lit.callbacks.non_finite import NonFiniteLossError

    return find_cause(exc, NonFiniteLossError)


def load_manifest(path: str | Path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise UserInputError(f"cannot read the sweep manifest {path}: {exc}") from exc


def children_of(manifest: dict, phase: str) -> list[Child]:
    return [Child(**c) for c in manifest["children"] if c["phase"] == phase]


def main(argv: list[str] | None = None) -> int:
    """``python -m lit.sweep.child MANIFEST PHASE INDEX``: one array task of a SLURM sweep.

    Skips the child if a run of it is already done (finished or diverged: a requeued or resubmitted array
    redoes nothing), or is being run by another live process; a run whose owner is gone is marked KILLED.
    """
    import argparse

    from mlflow import MlflowClient

    from lit.sweep.store import child_runs, done_by_key, experiment_id_for, settle_unfinished_runs

    parser = argparse.ArgumentParser(prog="python -m lit.sweep.child", description=main.__doc__.splitlines()[0])
    parser.add_argument("manifest")
    parser.add_argument("phase", choices=[P.TUNE_PHASE, P.SEED_PHASE, P.SHARED_PHASE])
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
        runs = [r for r in child_runs(client, experiment_id, manifest["protocol"]["sweep_id"])
                if child.key in (r.data.tags.get(P.CHILD_KEY), r.data.tags.get(P.REUSED_AS))]
        if child.key in done_by_key(runs):
            print(f"{child.key}: already finished")
            return 0
        settle_unfinished_runs(client, runs)
    except UserInputError as exc:
        return report(exc)
    code = run_child(manifest, child)
    # An outcome is a success for the scheduler: the seed array waits on the tuning array with afterok.
    return 0 if code in (DIVERGED_EXIT, ALL_DIVERGED_EXIT, OWNED_ELSEWHERE_EXIT) else code


if __name__ == "__main__":
    sys.exit(main())
