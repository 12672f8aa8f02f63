"""Send to the tracking server later what could not reach it during training.

    python cli.py sync send runs/<exp>/<run>/unsent_metrics.jsonl
        the metrics a run kept while its server was down at the end of training (and its final status)
    python cli.py sync run RUN_ID --from sqlite:///mlflow.db --to http://host:5000
        a whole run logged to the local store because the server was down when it started
        (MLflowLogger(if_unreachable="local")): params, tags, every metric's history, artifacts, status

Both say what they sent in one line, and fail with one ``error:`` line (exit code 2).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from lit.errors import OneLineArgumentParser, UserInputError, one_line_errors
from lit.tracking.batches import MAX_METRICS_PER_BATCH, MAX_PARAMS_PER_BATCH, batches
from lit.tracking.history import logged_steps
from lit.tracking.names import COPIED_FROM, SYNCED_TO, TRAINING_EXPERIMENT


def send(journal: str | Path, tracking_uri: str | None = None) -> str:
    """Log a journal of unsent metrics into its run and set the run's final status; removes the journal.

    ``tracking_uri`` overrides the store named in the journal (a server that moved)."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    journal = Path(journal)
    if not journal.is_file():
        raise UserInputError(f"{journal} not found; a run leaves unsent_metrics.jsonl in its folder under runs/")
    lines = journal.read_text().splitlines()
    try:
        header = json.loads(lines[0])
        metrics = [Metric(m["key"], m["value"], m["timestamp"], m["step"]) for m in map(json.loads, lines[1:])]
    except (IndexError, KeyError, ValueError) as exc:
        raise UserInputError(f"{journal} is not a journal of unsent metrics ({exc})") from exc
    uri = tracking_uri or header["tracking_uri"]
    client = MlflowClient(uri)
    # A resumed training may have logged them since (from its checkpoint, or by training the steps again).
    there = logged_steps(client, header["run_id"], {m.key for m in metrics})
    new = [m for m in metrics if (m.key, m.step) not in there]
    for part in batches(new, MAX_METRICS_PER_BATCH):
        client.log_batch(header["run_id"], metrics=part)
    if header.get("status"):
        client.set_terminated(header["run_id"], header["status"])
    journal.unlink()
    already = f" ({len(metrics) - len(new)} were there already)" if len(new) < len(metrics) else ""
    return (f"sent {len(new)} metric values to run {header['run_id']} at {uri}{already}"
            + (f" and marked it {header['status']}" if header.get("status") else ""))


def copy_run(run_id: str, source: str, target: str, force: bool = False) -> str:
    """Copy run ``run_id`` from the store ``source`` into ``target`` (same experiment name); returns a summary."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.exceptions import MlflowException

    src, dst = MlflowClient(source), MlflowClient(target)
    try:
        run = src.get_run(run_id)
    except MlflowException as exc:
        raise UserInputError(f"run {run_id} is not in {source}") from exc
    if run.data.tags.get(SYNCED_TO) and not force:
        raise UserInputError(f"run {run_id} was already copied to {run.data.tags[SYNCED_TO]}; pass --force to copy "
                             f"it again")
    name = src.get_experiment(run.info.experiment_id).name
    experiment = dst.get_experiment_by_name(name)
    experiment_id = experiment.experiment_id if experiment else dst.create_experiment(name, tags=TRAINING_EXPERIMENT)
    tags = {k: v for k, v in run.data.tags.items() if k != SYNCED_TO}
    copy = dst.create_run(experiment_id, start_time=run.info.start_time, tags=tags, run_name=run.info.run_name)
    new_id = copy.info.run_id
    params = [Param(k, v) for k, v in run.data.params.items()]
    for part in batches(params, MAX_PARAMS_PER_BATCH):
        dst.log_batch(new_id, params=part)
    history = [Metric(m.key, m.value, m.timestamp, m.step) for key in run.data.metrics
               for m in src.get_metric_history(run_id, key)]
    for part in batches(history, MAX_METRICS_PER_BATCH):
        dst.log_batch(new_id, metrics=part)
    dst.log_batch(new_id, tags=[RunTag(COPIED_FROM, f"{source}#{run_id}")])
    with tempfile.TemporaryDirectory() as tmp:
        if src.list_artifacts(run_id):
            dst.log_artifacts(new_id, src.download_artifacts(run_id, "", tmp))
    if run.info.status != "RUNNING":
        dst.set_terminated(new_id, run.info.status, end_time=run.info.end_time)
    src.set_tag(run_id, SYNCED_TO, f"{target}#{new_id}")
    return f"copied run {run_id} ({len(params)} params, {len(history)} metric values) to {target} as run {new_id}"


@one_line_errors
def main(argv: list[str]) -> int:
    parser = OneLineArgumentParser(prog="cli.py sync", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("send", help="send a run's unsent_metrics.jsonl")
    s.add_argument("journal")
    s.add_argument("--to", dest="target", help="the store to send to, if not the one the journal names")
    r = sub.add_parser("run", help="copy a run from one tracking store to another")
    r.add_argument("run_id")
    r.add_argument("--from", dest="source", required=True, help="the store the run is in (sqlite:///mlflow.db)")
    r.add_argument("--to", dest="target", required=True, help="the server to copy it to (http://host:port)")
    r.add_argument("--force", action="store_true", help="copy a run that was copied before")
    args = parser.parse_args(argv)
    if args.command == "send":
        print(send(args.journal, args.target))
    else:
        print(copy_run(args.run_id, args.source, args.target, args.force))
    return 0
