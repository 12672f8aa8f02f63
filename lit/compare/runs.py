"""A sweep read back from MLflow: its parent run, the protocol artifact, the final child runs and their histories.

Nothing but the tracking store is read (the layout is ``lit/sweep/protocol.py``), so a sweep launched as a job
array and one launched on a laptop give the same report.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from lit.compare import stats
from lit.errors import UserInputError
from lit.sweep import protocol
from lit.sweep.store import search_all_runs
from lit.tracking.dataset_input import DATA_DIGEST_TAG
from lit.tracking.downloads import quiet_downloads
from lit.tracking.names import DEPTH_QUANTITY_PREFIXES, STREAM_RMS_PREFIX
from lit.tracking.names import SPIKE_COUNT as SPIKE_METRIC

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Run

LISTED = 10  # names shown in an error that lists what exists
DEFAULT_METRIC = "val/loss"  # for a protocol that does not name its metric
RUN_COLUMNS = ("run_id", "variant", "seed", "seed_index", "tune_value", "start_time", "outcome", "diverged_step")
TUNE_COLUMNS = ("variant", "tune_value", "status", "outcome")
DUPLICATE_RULE = "the latest-started run counts (FINISHED or diverged); the others are left out"
HISTORY_COLUMNS = ("run_id", "key", "step", "timestamp", "value")
SYSTEM_PREFIX = "system/"


@dataclass(frozen=True)
class Sweep:
    """What ``compare`` knows about a sweep: all of it comes from the tracking store.

    ``runs`` has one row per counted seed run (tagged final, FINISHED or diverged; the newest one when a
    (variant, seed) was run twice), its ``outcome`` "finished" or "diverged"; ``history`` the metric histories
    of the finished ones in long format. A diverged run is an outcome of the comparison, not a missing run.
    """

    parent_id: str
    experiment: str
    protocol: dict[str, Any]
    metric: str  # the one compared: --metric, else the protocol's
    runs: pd.DataFrame
    history: pd.DataFrame
    logged: tuple[str, ...]  # every metric key some counted run logged (system metrics aside)
    left_out: dict[str, int]  # MLflow status -> final runs not FINISHED, hence not counted
    replaced: int  # counted final runs of a (variant, seed) that a newer counted run superseded
    tune_runs: int  # tuning-phase child runs found, whatever their status
    duplicates: tuple[tuple[str, str, int], ...] = ()  # (variant, seed, runs found) where more than one counted
    tuning: pd.DataFrame | None = None  # one row per tuning run: variant, tune_value, status, outcome
    examples: dict[str, Any] | None = None  # run id -> per-example test results of the metric (lit/compare/examples.py)
    looks: tuple[dict, ...] = ()  # a sequential sweep's recorded looks (lit/sweep/history.py), look 1 first
    extensions: tuple[dict, ...] = ()  # --add_seeds extensions outside a sequential plan, recorded
    shared: pd.DataFrame | None = None  # --shared_value: the runs at the baseline's value (lit/compare/shared_value.py)

    @property
    def sweep_id(self) -> str:
        return str(self.protocol.get("sweep_id") or self.parent_id)


def connect(uri: str) -> MlflowClient:
    """A client on ``uri``. A sqlite file that does not exist is an error: MLflow would silently create an
    empty store and every later message would be about a missing experiment instead of a wrong path."""
    from mlflow import MlflowClient

    prefix = "sqlite:///"
    if uri.startswith(prefix) and ":memory:" not in uri and not Path(uri[len(prefix):]).is_file():
        raise UserInputError(f"no MLflow database at {uri[len(prefix):]}; pass --tracking_uri (or set "
                             "MLFLOW_TRACKING_URI) to the store the sweep logged to")
    return MlflowClient(uri)


def find_parent(client: MlflowClient, experiment: str | None = None, sweep_run_id: str | None = None) -> Run:
    """The sweep's parent run: the one named, or the most recently started one of ``experiment``."""
    if sweep_run_id is not None:
        return _named_parent(client, sweep_run_id)
    found = client.get_experiment_by_name(experiment)
    if found is None or found.lifecycle_stage == "deleted":
        names = [e.name for e in client.search_experiments(max_results=LISTED, order_by=["last_update_time DESC"])]
        listed = ", ".join(repr(n) for n in names) if names else "none"
        raise UserInputError(f"no experiment named {experiment!r} in this tracking store (experiments: {listed}); "
                             "pass one of them to --experiment, or --tracking_uri for another store")
    parents = client.search_runs([found.experiment_id], f"tags.`{protocol.ROLE}` = '{protocol.PARENT}'",
                                 order_by=["attributes.start_time DESC"], max_results=1)
    if not parents:
        raise UserInputError(f"experiment {experiment!r} has no sweep parent run (tag {protocol.ROLE} = parent); "
                             "launch a sweep with `python cli.py sweep`, or pass --sweep PARENT_RUN_ID")
    return parents[0]


def family_parents(client: MlflowClient, parent: Run, family: str) -> list[Run]:
    """The other sweep parents of ``parent``'s experiment whose protocol declares the same family."""
    parents = search_all_runs(client, parent.info.experiment_id, f"tags.`{protocol.ROLE}` = '{protocol.PARENT}'")
    members = []
    for other in parents:
        if other.info.run_id == parent.info.run_id:
            continue
        try:
            spec = read_protocol(client, other)
        except UserInputError:  # a sweep that never got as far as writing its protocol has nothing to add
            continue
        if spec.get("family") == family:
            members.append(other)
    return members


def _named_parent(client: MlflowClient, run_id: str) -> Run:
    from mlflow.exceptions import MlflowException

    try:
        run = client.get_run(run_id)
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        raise UserInputError(f"no MLflow run {run_id!r} in this tracking store; pass the run id of a sweep's "
                             "parent run to --sweep (or --experiment NAME for its latest sweep)") from None
    tags = run.data.tags
    if tags.get(protocol.ROLE) != protocol.PARENT:
        # The id most often passed by mistake is a child's, copied from the UI: point at its parent.
        hint = (f"; its parent run is {tags[protocol.PARENT_RUN]}" if tags.get(protocol.ROLE) == protocol.CHILD
                and protocol.PARENT_RUN in tags else "")
        raise UserInputError(f"run {run_id} is not a sweep parent run (tag {protocol.ROLE} is "
                             f"{tags.get(protocol.ROLE)!r}, expected 'parent'){hint}; pass a parent's run id to "
                             "--sweep, or --experiment NAME for the latest sweep")
    return run


def read_protocol(client: MlflowClient, parent: Run) -> dict[str, Any]:
    """The parent's ``protocol.json``: which variants, seeds, metric and tuning rule the sweep was run with."""
    from mlflow.exceptions import MlflowException

    with tempfile.TemporaryDirectory() as tmp, quiet_downloads():
        try:
            path = client.download_artifacts(parent.info.run_id, protocol.PROTOCOL_FILE, tmp)
            return json.loads(Path(path).read_text())
        except (MlflowException, OSError, ValueError) as exc:
            raise UserInputError(f"sweep parent run {parent.info.run_id} has no readable {protocol.PROTOCOL_FILE} "
                                 f"artifact ({type(exc).__name__}); it was not written by `cli.py sweep`, or the "
                                 "sweep did not get as far as starting") from None


def load_sweep(client: MlflowClient, parent: Run, metric_of: str | None = None) -> Sweep:
    """The sweep of ``parent``, with the histories of what the report shows for ``metric_of``
    (default: the protocol's ``report_metric``, else, in a sweep written before it, its tuning ``metric``).
    Raises ``UserInputError`` when nothing can be reported."""
    spec = read_protocol(client, parent)
    metric = metric_of or spec.get("report_metric") or spec.get("metric") or DEFAULT_METRIC
    children = search_all_runs(client, parent.info.experiment_id,
                               f"tags.`{protocol.PARENT_RUN}` = '{parent.info.run_id}'")
    final = [r for r in children if protocol.is_true(r.data.tags.get(protocol.FINAL))]
    finished = [r for r in final if r.info.status == "FINISHED"]
    counted = [r for r in final if r.info.status == "FINISHED" or is_diverged(r)]
    left_out: dict[str, int] = {}
    for run in final:
        if run.info.status != "FINISHED" and not is_diverged(run):
            left_out[run.info.status] = left_out.get(run.info.status, 0) + 1
    if not finished:
        found = f"{len(final)} final child runs, none FINISHED ({_counts(left_out)})" if final else \
            f"{len(children)} child runs, none tagged {protocol.FINAL} = true"
        raise UserInputError(f"sweep {parent.info.run_id} has no FINISHED final child runs ({found}); let the "
                             "sweep finish, or re-run it (`cli.py sweep` skips the runs already FINISHED)")
    runs = _runs_table(counted)
    kept = runs.drop_duplicates(["variant", "seed"], keep="last")
    sizes = runs.groupby(["variant", "seed"]).size()
    duplicates = tuple((str(v), str(s), int(n)) for (v, s), n in sizes.items() if n > 1)
    kept_ids = set(kept[kept["outcome"] == protocol.FINISHED_OUTCOME].run_id)
    refuse_different_data([r for r in finished if r.info.run_id in kept_ids], parent.info.run_id)
    logged = sorted({k for r in finished if r.info.run_id in kept_ids for k in r.data.metrics
                     if not k.startswith(SYSTEM_PREFIX)})
    if metric not in logged:
        raise UserInputError(f"no final run of sweep {parent.info.run_id} logged the metric {metric!r}; pass one "
                             f"they logged to --metric: {', '.join(logged) or 'none'}")
    # The tuning metric too: when the compared one is read once (a test split), the curves read it instead.
    wanted = {k for k in logged if k in (metric, spec.get("metric")) or is_supporting_metric(k)}
    keys_by_run = {r.info.run_id: sorted(wanted & set(r.data.metrics)) for r in finished if r.info.run_id in kept_ids}
    return Sweep(parent_id=parent.info.run_id, experiment=_experiment_name(client, parent), protocol=spec,
                 metric=metric, runs=kept.reset_index(drop=True), history=read_histories(client, keys_by_run),
                 logged=tuple(logged), left_out=left_out, replaced=len(runs) - len(kept),
                 tune_runs=sum(r.data.tags.get(protocol.PHASE) == protocol.TUNE_PHASE for r in children),
                 duplicates=duplicates, tuning=_tuning_table(children), examples=_examples(client, metric, kept_ids),
                 shared=_shared(client, spec, children, metric), **_course(client, parent.info.run_id))


def refuse_different_data(runs: list[Run], sweep_run_id: str) -> None:
    """Paired differences mean something only if every run saw the same data: runs whose dataset digests
    (``arch_lab.data.digest``, lit/tracking/dataset_input.py) differ are refused. Runs without one are not judged."""
    by_digest: dict[str, Run] = {}
    for run in runs:
        digest = run.data.tags.get(DATA_DIGEST_TAG)
        if digest:
            by_digest.setdefault(digest, run)
    if len(by_digest) > 1:
        shown = "; ".join(f"{d} ({r.data.tags.get(protocol.VARIANT, '?')}, seed {r.data.tags.get(protocol.SEED, '?')})"
                          for d, r in list(by_digest.items())[:3])
        raise UserInputError(f"the runs of sweep {sweep_run_id} saw different data (dataset digests {shown}), so their "
                             f"differences do not pair; re-run the odd runs on the same shards and tokenizer")


def _shared(client: MlflowClient, spec: dict, children: list[Run], metric: str) -> pd.DataFrame | None:
    """A ``--shared_value`` sweep's runs at the baseline's value (None for any other sweep)."""
    return shared_value_runs(client, children, metric) if spec.get("shared_value") else None


def shared_value_runs(client: MlflowClient, children: list[Run], metric: str) -> pd.DataFrame:
    """One row per counted run at the baseline's value (tagged ``SHARED_VALUE``; FINISHED, or diverged: an outcome),
    the latest per (variant, seed), with ``value``: its final ``metric`` (NaN when diverged or never logged)."""
    tagged = [r for r in children if protocol.is_true(r.data.tags.get(protocol.SHARED_VALUE))
              and (r.info.status == "FINISHED" or is_diverged(r))]
    table = _runs_table(tagged).drop_duplicates(["variant", "seed"], keep="last")
    finished = table[table["outcome"] == protocol.FINISHED_OUTCOME]
    history = read_histories(client, {run_id: [metric] for run_id in finished["run_id"]})
    finals = {run_id: stats.final_value(points) for run_id, points in history.groupby("run_id")}
    return table.assign(value=table["run_id"].map(finals).astype(float)).reset_index(drop=True)


def _examples(client: MlflowClient, metric: str, run_ids: set[str]) -> dict[str, Any]:
    """Per-example results of a test-split metric (``test/loss`` -> each run's ``loss`` array), where logged."""
    from lit.compare.examples import load

    if not metric.startswith("test/"):
        return {}
    with quiet_downloads():
        return load(client, sorted(run_ids), metric.rsplit("/", 1)[-1])


def _course(client: MlflowClient, run_id: str) -> dict[str, tuple[dict, ...]]:
    """The sweep's never-overwritten history: its recorded looks and extensions."""
    from lit.sweep.history import read_extensions, read_looks

    return {"looks": tuple(read_looks(client, run_id)), "extensions": tuple(read_extensions(client, run_id))}


def is_diverged(run: Run) -> bool:
    """A run that ended because its loss went non-finite: FAILED and tagged so (any other FAILED run crashed)."""
    return run.info.status == "FAILED" and run.data.tags.get(protocol.OUTCOME) == protocol.DIVERGED_OUTCOME


def _tuning_table(children: list[Run]) -> pd.DataFrame:
    rows = [(r.data.tags.get(protocol.VARIANT, "?"), r.data.tags.get(protocol.TUNE_VALUE), r.info.status,
             protocol.DIVERGED_OUTCOME if is_diverged(r) else r.data.tags.get(protocol.OUTCOME))
            for r in children if r.data.tags.get(protocol.PHASE) == protocol.TUNE_PHASE]
    return pd.DataFrame(rows, columns=list(TUNE_COLUMNS))


def is_supporting_metric(key: str) -> bool:
    """Metrics the report reads besides the compared one: size, throughput, batch size, diagnostics."""
    return (key in (protocol.PARAMETERS_METRIC, protocol.ITEMS_PER_STEP_METRIC) or is_throughput_metric(key)
            or key.startswith(STREAM_RMS_PREFIX) or key == SPIKE_METRIC or key.startswith(DEPTH_QUANTITY_PREFIXES))


def is_throughput_metric(key: str) -> bool:
    return key in protocol.THROUGHPUT_METRICS or (key.startswith("train/") and key.endswith("_per_s"))


def read_histories(client: MlflowClient, keys_by_run: dict[str, list[str]]) -> pd.DataFrame:
    """Every logged point of each run's keys, long format: one request per (run, key), as MLflow serves them."""
    rows = []
    for run_id, keys in keys_by_run.items():
        for key in keys:
            rows.extend((run_id, key, m.step, m.timestamp, m.value) for m in client.get_metric_history(run_id, key))
    return pd.DataFrame(rows, columns=list(HISTORY_COLUMNS))


def _runs_table(runs: list[Run]) -> pd.DataFrame:
    """One row per run, oldest first, so that keeping the last of a (variant, seed) keeps the newest."""
    rows = []
    for run in runs:
        tags = run.data.tags
        outcome = protocol.DIVERGED_OUTCOME if is_diverged(run) else protocol.FINISHED_OUTCOME
        rows.append((run.info.run_id, tags.get(protocol.VARIANT, "?"), tags.get(protocol.SEED, "?"),
                     _int_or_none(tags.get(protocol.SEED_INDEX)), tags.get(protocol.TUNE_VALUE),
                     run.info.start_time or 0, outcome, _int_or_none(tags.get(protocol.DIVERGED_STEP))))
    return pd.DataFrame(rows, columns=list(RUN_COLUMNS)).sort_values("start_time", kind="stable")


def _int_or_none(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _experiment_name(client: MlflowClient, run: Run) -> str:
    return client.get_experiment(run.info.experiment_id).name


def _counts(by_status: dict[str, int]) -> str:
    return ", ".join(f"{status}: {n}" for status, n in sorted(by_status.items()))
