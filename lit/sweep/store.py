"""A sweep's state in the tracking store: the parent run, which children are done, what tuning picked.

The store is the only state a sweep has (``protocol.py`` says how it is laid out), so a local sweep, a
rerun after a crash and a SLURM job array all see the same thing: a child is done when one of its runs
is FINISHED; the tuned value of a variant is recomputed from its finished tuning runs whenever asked.
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
from lit.tracking.names import TRAINING_EXPERIMENT

PAGE = 1000  # runs per search request


def find_or_create_parent(client: MlflowClient, experiment: str, proto: dict) -> tuple[str, bool]:
    """The sweep's parent run (created with its protocol if new); returns (run id, existed)."""
    experiment_id = experiment_id_for(client, experiment, create=True)
    found = client.search_runs([experiment_id], f"tags.`{P.SWEEP_ID}` = '{proto['sweep_id']}' and "
                                                f"tags.`{P.ROLE}` = '{P.PARENT}'",
                               order_by=["attributes.start_time DESC"], max_results=1)
    if found:
        run_id = found[0].info.run_id
        client.update_run(run_id, status="RUNNING")
        return run_id, True
    run = client.create_run(experiment_id, run_name=f"sweep {proto['sweep_id'][:8]}",
                            tags={P.ROLE: P.PARENT, P.SWEEP_ID: proto["sweep_id"]})
    run_id = run.info.run_id
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / P.PROTOCOL_FILE
        path.write_text(json.dumps(proto, indent=1))
        client.log_artifact(run_id, str(path))
    client.log_param(run_id, "sweep.recipe", proto["recipe"])
    client.log_param(run_id, "sweep.variants", ", ".join(v["label"] for v in proto["variants"])[:6000])
    client.log_param(run_id, "sweep.seeds", ",".join(map(str, proto["seeds"])))
    client.log_param(run_id, "sweep.metric", proto["metric"])
    client.log_param(run_id, "sweep.tuning", proto["tune"]["rule"] if proto["tune"] else "none")
    return run_id, False


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


def finished_by_key(runs: list[Run]) -> dict[str, Run]:
    """The latest FINISHED run of each child key."""
    done: dict[str, Run] = {}
    for run in sorted(runs, key=lambda r: r.info.start_time):
        if run.info.status == "FINISHED":
            done[run.data.tags.get(P.CHILD_KEY, "")] = run
    return done


def mark_stale_runs(client: MlflowClient, runs: list[Run]) -> int:
    """Runs left RUNNING by a sweep that was killed are marked KILLED (they are rerun). Only safe when no
    other process of this sweep is running, which is what a local sweep assumes."""
    stale = [r for r in runs if r.info.status == "RUNNING"]
    for run in stale:
        client.set_terminated(run.info.run_id, status=RunStatus.to_string(RunStatus.KILLED))
    return len(stale)


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


def pick_tuned_value(client: MlflowClient, experiment_id: str, sweep: str, variant: str, values: list[str],
                     metric: str) -> tuple[str, Run]:
    """The tuning value with the best final ``metric`` among the variant's finished tuning runs.

    Every value must have finished: a pick among some of them would depend on which ran first. Ties (and
    NaN, a diverged run) go to the earlier value in the list, so the pick is deterministic.
    """
    done = finished_by_key([r for r in child_runs(client, experiment_id, sweep)
                            if r.data.tags.get(P.VARIANT) == variant and r.data.tags.get(P.PHASE) == P.TUNE_PHASE])
    by_value = {v: r for r in done.values() for v in values if same_value(r.data.tags.get(P.TUNE_VALUE), v)}
    missing = [v for v in values if v not in by_value]
    if missing:
        raise UserInputError(f"tuning of variant {variant} has not finished for {', '.join(missing)}; "
                             "run (or rerun) its tuning runs first")
    sign = -1.0 if P.metric_mode(metric) == "max" else 1.0
    scores = [(sign * final_metric(client, by_value[v], metric), i, v) for i, v in enumerate(values)]
    finite = [s for s in scores if not math.isnan(s[0])]
    if not finite:
        raise UserInputError(f"every tuning run of variant {variant} ended without a finite {metric}; "
                             "widen the tuning values (lower learning rates) or check the runs")
    _, _, best = min(finite)
    return best, by_value[best]
