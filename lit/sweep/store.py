"""A sweep's state in the tracking store: the parent run, which children are done, what tuning picked.

The store is the only state a sweep has (``protocol.py`` says how it is laid out), so a local sweep, a
rerun after a crash and a SLURM job array all see the same thing: a child is done when one of its runs
has an outcome (FINISHED and tagged finished, or FAILED and tagged diverged); the tuned value of a variant
is recomputed from its done tuning runs whenever asked.
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

from mlflow import MlflowClient
from mlflow.entities import Run, RunStatus

from lit.errors import UserInputError
from lit.sweep import protocol as P
from lit.tracking.downloads import quiet_downloads
from lit.tracking.names import TRAINING_EXPERIMENT

PAGE = 1000  # runs per search request


LINEAGE = P.PREFIX + "lineage"  # on the parent: the hash of what the sweep runs, shared by its restarts


def find_parent(client: MlflowClient, experiment_id: str, lineage: str, oldest: bool = False,
                sweep: str | None = None) -> Run | None:
    """The newest parent run of a sweep (``--new_sweep`` starts another one in the same lineage); with
    ``oldest``, the first one created (of the sweep id ``sweep``, if given)."""
    query = f"tags.`{LINEAGE}` = '{lineage}' and tags.`{P.ROLE}` = '{P.PARENT}'"
    if sweep is not None:
        query += f" and tags.`{P.SWEEP_ID}` = '{sweep}'"
    found = client.search_runs([experiment_id], query, max_results=1,
                               order_by=[f"attributes.start_time {'ASC' if oldest else 'DESC'}"])
    return found[0] if found else None


def parents_in_lineage(client: MlflowClient, experiment_id: str, lineage: str) -> int:
    return len(search_all_runs(client, experiment_id, f"tags.`{LINEAGE}` = '{lineage}' and "
                                                      f"tags.`{P.ROLE}` = '{P.PARENT}'"))


def create_parent(client: MlflowClient, experiment_id: str, proto: dict, lineage: str, tags: dict) -> str:
    """A new parent run holding the protocol; returns its id."""
    run = client.create_run(experiment_id, run_name=f"sweep {proto['sweep_id'][:8]}",
                            tags={P.ROLE: P.PARENT, P.SWEEP_ID: proto["sweep_id"], LINEAGE: lineage, **tags})
    run_id = run.info.run_id
    write_protocol(client, run_id, proto)
    client.log_param(run_id, "sweep.recipe", proto["recipe"])
    client.log_param(run_id, "sweep.variants", ", ".join(v["label"] for v in proto["variants"])[:6000])
    client.log_param(run_id, "sweep.metric", proto["metric"])
    client.log_param(run_id, "sweep.report_metric", proto["report_metric"])
    client.log_param(run_id, "sweep.tuning", proto["tune"]["description"] if proto["tune"] else "none")
    return run_id


def write_protocol(client: MlflowClient, run_id: str, proto: dict) -> None:
    """(Re)write the parent's protocol artifact: ``--add_seeds`` extends its seeds."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / P.PROTOCOL_FILE
        path.write_text(json.dumps(proto, indent=1))
        client.log_artifact(run_id, str(path))


def read_protocol(client: MlflowClient, run_id: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp, quiet_downloads():
        return json.loads(Path(client.download_artifacts(run_id, P.PROTOCOL_FILE, tmp)).read_text())


def _local_path(uri: str) -> Path | None:
    if uri.startswith("file://"):
        return Path(uri[len("file://"):])
    return Path(uri) if uri.startswith("/") else None


def follow_moved_store(client: MlflowClient, experiment_id: str) -> str | None:
    """Point an experiment's artifact paths at the folder beside its sqlite store, when the project was moved.

    MLflow records artifact folders by absolute path (``<launch folder>/mlruns/<experiment>``). A project moved or
    copied with its ``mlflow.db`` and ``mlruns/`` still names the old folder: gone (reading the sweep's protocol
    fails), or the original's (a copy would write into it). When the same ``mlruns/<experiment>`` sits beside this
    store, its records are rewritten to it (the experiment's location and each run's). Returns the new location,
    or None when nothing was moved.
    """
    from lit.tracking.uri import sqlite_path

    db = sqlite_path(client.tracking_uri)
    recorded = _local_path(client.get_experiment(experiment_id).artifact_location)
    if db is None or recorded is None:
        return None
    here = Path(db).resolve().parent / recorded.parent.name / recorded.name
    if here == recorded or not here.is_dir():
        return None
    import sqlite3

    old, new = str(recorded), str(here)
    with sqlite3.connect(db, timeout=60) as con:
        for column, table in (("artifact_location", "experiments"), ("artifact_uri", "runs")):
            for prefix in ("file://", ""):
                con.execute(f"UPDATE {table} SET {column} = ? || substr({column}, ?) WHERE experiment_id = ? AND "
                            f"({column} = ? OR substr({column}, 1, ?) = ?)",
                            (prefix + new, len(prefix + old) + 1, experiment_id, prefix + old,
                             len(prefix + old) + 1, prefix + old + "/"))
    return new


def experiment_id_for(client: MlflowClient, name: str, create: bool = False) -> str:
    experiment = client.get_experiment_by_name(name)
    if experiment is not None and experiment.lifecycle_stage == "deleted":
        raise UserInputError(f"MLflow experiment {name!r} is deleted; restore it (mlflow experiments restore) "
                             "or pick another --experiment")
    if experiment is None:
        if not create:
            raise UserInputError(f"no MLflow experiment {name!r}")
        return client.create_experiment(name, tags=TRAINING_EXPERIMENT)
    return experiment.experiment_id


def search_all_runs(client: MlflowClient, experiment_id: str, filter_string: str) -> list[Run]:
    """Every run matching ``filter_string``, across MLflow's pages (a wide sweep has more than a page; one page
    would make a resumed sweep rerun the finished children it did not see)."""
    runs, token = [], None
    while True:
        page = client.search_runs([experiment_id], filter_string, max_results=PAGE, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def child_runs(client: MlflowClient, experiment_id: str, sweep: str) -> list[Run]:
    return search_all_runs(client, experiment_id, f"tags.`{P.SWEEP_ID}` = '{sweep}' and tags.`{P.ROLE}` = '{P.CHILD}'")


def outcome(run: Run) -> str | None:
    """``"finished"`` or ``"diverged"`` for a child that is done, None for one that is not (running, crashed,
    killed, or killed after training but before it was tagged: it runs again)."""
    tag = run.data.tags.get(P.OUTCOME)
    if run.info.status == "FINISHED" and tag == P.FINISHED_OUTCOME:
        return P.FINISHED_OUTCOME
    if run.info.status == "FAILED" and tag == P.DIVERGED_OUTCOME:
        return P.DIVERGED_OUTCOME
    return None


def done_by_key(runs: list[Run]) -> dict[str, Run]:
    """The latest done run (finished, or diverged: an outcome too, never rerun) of each child key."""
    done: dict[str, Run] = {}
    for run in sorted(runs, key=lambda r: r.info.start_time):
        if outcome(run) is not None:
            done[run.data.tags.get(P.CHILD_KEY, "")] = run
            if P.REUSED_AS in run.data.tags:  # a seed run that is also its variant's run at the baseline's value
                done[run.data.tags[P.REUSED_AS]] = run
    return done


def settle_unfinished_runs(client: MlflowClient, runs: list[Run]) -> tuple[int, dict[str, Run]]:
    """Unfinished runs whose owner is gone are marked KILLED (their children run again); returns how many,
    and the live ones by child key (another process is running them: they must not run twice)."""
    from lit.sweep.ownership import owner_alive

    stale, live = 0, {}
    for run in runs:
        if outcome(run) is not None or run.info.status not in ("RUNNING", "FINISHED"):
            continue
        if run.info.status == "RUNNING" and owner_alive(run.data.tags):
            live[run.data.tags.get(P.CHILD_KEY, "")] = run
            continue
        client.set_terminated(run.info.run_id, status=RunStatus.to_string(RunStatus.KILLED))
        stale += 1
    return stale, live


def final_metric(client: MlflowClient, run: Run, metric: str) -> float:
    """The metric's value at its last logged step (not MLflow's "latest by time", which ties on resume)."""
    history = client.get_metric_history(run.info.run_id, metric)
    if not history:
        return math.nan
    return max(history, key=lambda m: (m.step, m.timestamp)).value


def same_value(stored: str | None, given: str) -> bool:
    """A tag's value against the one given on the command line: the config parser may have rewritten a
    number on its way into the run (``1e-3`` arrives as ``0.001``)."""
    if stored is None:
        return False
    if stored == given:
        return True
    try:
        return float(stored) == float(given)
    except ValueError:
        return False


class AllTuningDiverged(Exception):
    """Every tuning value of a variant diverged: the variant is diverged at every value, its seeds never run."""


def pick_tuned_value(client: MlflowClient, experiment_id: str, sweep: str, variant: str, values: list[str],
                     metric: str, mode: str) -> tuple[str, Run]:
    """The tuning value with the best final ``metric`` among the variant's tuning runs that did not diverge.

    Every value must be done (finished or diverged): a pick among some of them would depend on which ran
    first. A diverged run, or one whose final metric is not a number, is never picked; ties go to the
    earlier value in the list, so the pick is deterministic. Raises ``AllTuningDiverged`` when no value is left.
    """
    done = done_by_key([r for r in child_runs(client, experiment_id, sweep)
                        if r.data.tags.get(P.VARIANT) == variant and r.data.tags.get(P.PHASE) == P.TUNE_PHASE])
    by_value = {v: r for r in done.values() for v in values if same_value(r.data.tags.get(P.TUNE_VALUE), v)}
    missing = [v for v in values if v not in by_value]
    if missing:
        raise UserInputError(f"tuning of variant {variant} has not finished for {', '.join(missing)}; "
                             "run (or rerun) its tuning runs first")
    results = {v: (outcome(by_value[v]) == P.DIVERGED_OUTCOME, final_metric(client, by_value[v], metric))
               for v in values}
    best = best_value(values, results, mode, variant)
    return best, by_value[best]


def best_value(values: list[str], results: dict[str, tuple[bool, float]], mode: str, variant: str) -> str:
    """The pick among ``values`` given (diverged, final metric) of each: pure, so its rule is tested alone."""
    sign = -1.0 if mode == "max" else 1.0
    scores = [(sign * results[v][1], i, v) for i, v in enumerate(values)
              if not results[v][0] and not math.isnan(results[v][1])]
    if not scores:
        raise AllTuningDiverged(f"every tuning value of variant {variant} diverged (or ended without a finite "
                                "metric); its seeds are not run")
    return min(scores)[2]
