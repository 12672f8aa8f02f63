"""MLflow as the default tracker, with the known crashes of MLFlowLogger + LightningCLI handled.

- A bare ``MLFlowLogger()`` falls back to the ``./mlruns`` file store, which MLflow >= 3.13 refuses:
  ``MLflowLogger`` defaults to ``sqlite:///mlflow.db`` (or ``MLFLOW_TRACKING_URI``, read when the
  logger is built, not when Lightning is imported).
- With a non-file URI, ``MLFlowLogger.save_dir`` is None, so LightningCLI's ``SaveConfigCallback``
  asserts and checkpoints land in a folder named after the experiment id. ``MLflowLogger`` keeps a
  local ``save_dir`` for checkpoints (``<save_dir>/<experiment_id>/<run_id>/checkpoints``) and
  ``LogConfigToMLflow`` writes the resolved config into the run instead of a shared file.
- Logging is asynchronous by default (a step never waits for the store; MLflow drains the queue
  before the run is marked terminated); a continued run keeps its params (MLflow forbids changing
  them); sharded checkpoints, which are directories, are logged as artifacts too (Lightning skips them).

- A server that does not answer is found before anything is built, in one line, and the user chooses
  what then happens (``if_unreachable``: fail, or log to the local store and copy the run later;
  ``lit/tracking_guard.py``). A server that goes away during training costs no metric: they wait in
  an outbox until it is back, and what it never took is kept in a file to send later
  (``lit/metric_outbox.py``, ``python -m lit.tracking_sync``).

One run per training under many processes, resume into the same run and system metrics are the
``MLflowRun`` callback's part (``lit/callbacks/mlflow_run.py``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import subprocess
import tempfile
import time
from argparse import Namespace
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from filelock import FileLock
from lightning.fabric.utilities.logger import _add_prefix, _convert_params, _flatten_dict
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from torch import Tensor, nn

from lit.errors import UserInputError
from lit.metric_outbox import MetricOutbox, short_error
from lit.tracking_guard import fail_fast, is_remote, unreachable_message, unreachable_reason

if TYPE_CHECKING:
    from mlflow import MlflowClient

# The code that runs, wherever the run is launched from: its commit is the run's provenance.
CODE_DIR = Path(__file__).resolve().parent.parent
DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
MAX_PARAM_LENGTH = 6000  # MLflow's limit; Lightning's own log_hyperparams truncates to 250
NOT_PARAMS = ("config", "ckpt_path")  # where the settings came from, not settings
ASYNC_BUFFERING = "MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS"
UNSENT_METRICS = "unsent_metrics.jsonl"  # in the run's folder, beside checkpoints/, while the store is down
FINAL_STATUS = {"success": "FINISHED", "finished": "FINISHED", "failed": "FAILED"}

log = logging.getLogger(__name__)


@rank_zero_only
def warn(message: str) -> None:
    """One line on stderr from rank 0 (a ``warnings.warn`` would add a line of our source code)."""
    log.warning(message)


class MLflowLogger(MLFlowLogger):
    """MLFlowLogger that works out of the box on MLflow 3.x, with run-specific checkpoint folders.

    Args:
        experiment_name: MLflow experiment.
        run_name: MLflow run name (default: MLflow picks one).
        tracking_uri: default ``$MLFLOW_TRACKING_URI`` or ``sqlite:///mlflow.db``; an
            ``http://host:port`` server works too.
        tags: extra run tags.
        save_dir: local folder for checkpoints, one subfolder per run.
        log_model: log checkpoints as artifacts (False, True at the end, or "all"), sharded
            checkpoint directories included.
        run_id: continue an existing run (it must exist in the tracking store).
        synchronous: wait for the store on every logging call. Default False: metrics go through an
            outbox that a background thread sends once per second, so a training step never waits for a
            database or a server; if the store cannot be reached the metrics are kept (in memory and in
            ``<save_dir>/<experiment>/<run>/unsent_metrics.jsonl``) and sent when it is back. Params
            are queued by MLflow (``$MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS``, set to 1 unless already
            set), which drains its queue before the run is marked terminated. None: MLflow's own
            default (synchronous).
        system_metrics: log CPU, memory, disk, network (and NVIDIA GPU) usage into the run with
            MLflow's ``SystemMetricsMonitor``, once per node (needs the ``MLflowRun`` callback,
            which the CLI adds).
        system_metrics_interval: seconds between two system-metric samples.
        if_unreachable: what to do when the tracking server does not answer before training (probed
            once, 3 s): ``fail`` with one line saying what to do, or ``local``: log to the local store
            ``sqlite:///mlflow.db`` with a warning that names the run and how to copy it to the server.
        flush_timeout: seconds the end of training waits for a store that went away to come back; what
            it has not taken by then is kept in ``unsent_metrics.jsonl`` with the run's final status
            (``python -m lit.tracking_sync send FILE`` sends it).
    """

    def __init__(self, experiment_name: str = "arch-lab", run_name: str | None = None,
                 tracking_uri: str | None = None, tags: dict[str, str] | None = None, save_dir: str = "runs",
                 log_model: Literal[True, False, "all"] = False, artifact_location: str | None = None,
                 run_id: str | None = None, synchronous: bool | None = False, system_metrics: bool = True,
                 system_metrics_interval: float = 10.0, if_unreachable: Literal["fail", "local"] = "fail",
                 flush_timeout: float = 60.0):
        if system_metrics_interval <= 0:
            raise UserInputError(f"system_metrics_interval must be a positive number of seconds, got "
                                 f"{system_metrics_interval}; or set system_metrics: false")
        tracking_uri = resolve_tracking_uri(tracking_uri)
        # Asked before anything is built: a server that is down would otherwise cost minutes of retries.
        self.fallback_from: str | None = None  # the server this run should have gone to (if_unreachable=local)
        reason = unreachable_reason(tracking_uri)
        if reason is not None:
            local = absolute_sqlite(DEFAULT_TRACKING_URI)
            if if_unreachable != "local":
                raise UserInputError(unreachable_message(tracking_uri, reason, DEFAULT_TRACKING_URI))
            warn(f"the MLflow tracking server {tracking_uri} is not reachable ({reason}); logging to the local "
                 f"store {local} instead (if_unreachable=local)")
            self.fallback_from, tracking_uri = tracking_uri, local
        if is_remote(tracking_uri):
            fail_fast()  # during training, a request to a server that went away fails in seconds
        # Every process builds a client, which creates the tables of a new sqlite database; processes
        # started together (torchrun, SLURM) would race in MLflow's migrations and one would crash.
        with sqlite_creation_lock(tracking_uri):
            super().__init__(experiment_name=experiment_name, run_name=run_name, tracking_uri=tracking_uri,
                             tags=tags, save_dir=save_dir, log_model=log_model,
                             artifact_location=artifact_location, run_id=run_id, synchronous=synchronous)
        if synchronous is False:
            # Unbuffered, MLflow sends each logging call as its own request from a pool of threads that
            # compete with training for the cores: logging every step cost a small model +36-42% per
            # step, merged per second +2-8% (benchmarks/results/logging_overhead.md). MLflow reads only
            # this process-wide setting; a value the user set wins.
            os.environ.setdefault(ASYNC_BUFFERING, "1")
        self._local_dir = save_dir
        self.system_metrics = system_metrics
        self.system_metrics_interval = system_metrics_interval
        # Where a run id came from when it was not passed by the user: (checkpoint path, its tracking URI).
        self._run_origin: tuple[str, str | None] | None = None
        self.continued = False  # the run existed before this training (resume or explicit run_id)
        self.flush_timeout = flush_timeout
        self._outbox: MetricOutbox | None = None
        self._final_status: str | None = None  # KILLED when a signal stopped training (lit/preemption.py)

    @property
    def save_dir(self) -> str:
        return self._local_dir

    @property
    def tracking_uri(self) -> str:
        return self._tracking_uri

    @property
    @rank_zero_experiment
    def experiment(self) -> MlflowClient:
        created = not self._initialized
        if created and self._run_id is not None:
            self._reopen_run()
        client = super().experiment
        if created and self.fallback_from is not None:
            client.set_tag(self._run_id, "arch_lab.meant_for", self.fallback_from)
            warn(f"MLflow run {self._run_id} is in the local store {self._tracking_uri}; when "
                 f"{self.fallback_from} is back, copy it there with: python -m lit.tracking_sync run "
                 f"{self._run_id} --from {self._tracking_uri} --to {self.fallback_from}")
        return client

    def _unsent_file(self) -> Path:
        return Path(self._local_dir) / str(self.experiment_id) / str(self.run_id) / UNSENT_METRICS

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        if self._log_batch_kwargs.get("synchronous") is not False:
            return super().log_metrics(metrics, step)
        from mlflow.entities import Metric

        now, batch = int(time.time() * 1000), []
        for key, value in _add_prefix(metrics, self._prefix, self.LOGGER_JOIN_CHAR).items():
            if isinstance(value, str):
                log.warning(f"Discarding metric with string value {key}={value}.")
                continue
            # MLflow's allowed characters, as Lightning's logger does.
            batch.append(Metric(re.sub("[^a-zA-Z0-9_/. -]+", "", key), float(value), now, step or 0))
        if self._outbox is None:
            self._outbox = MetricOutbox(self.experiment, self.run_id, self._unsent_file())
        self._outbox.put(batch)

    @rank_zero_only
    def mark_interrupted(self, signal_name: str, step: int, checkpoint: str) -> None:
        """Training was stopped by ``signal_name`` after saving ``checkpoint``: the run ends KILLED, tagged."""
        self._final_status = "KILLED"
        if not self._initialized:
            return
        from mlflow.entities import RunTag

        tags = {"arch_lab.stopped_by": signal_name, "arch_lab.stopped_at_step": str(step),
                "arch_lab.resume_from": checkpoint}
        try:
            self.experiment.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in tags.items()])
        except Exception as exc:  # the server is away: the checkpoint and the exit line say it all the same
            warn(f"could not tag MLflow run {self.run_id} as interrupted ({short_error(exc)})")

    @rank_zero_only
    def finalize(self, status: str = "success") -> None:
        """Send what is pending, log checkpoints, mark the run terminated; a store that stays away costs
        nothing: what it did not take is kept in a file, with one line saying how to send it."""
        if not self._initialized:
            return
        status = self._final_status or FINAL_STATUS.get(status, status)
        outbox, self._outbox = self._outbox, None
        left = outbox.close(self.flush_timeout, status) if outbox is not None else 0
        if self._checkpoint_callback:
            self._scan_and_log_checkpoints(self._checkpoint_callback)
            unlogged = checkpoints_to_log(self._checkpoint_callback, self._logged_model_time)
            if unlogged:
                warn(f"{len(unlogged)} checkpoints could not be logged to MLflow run {self.run_id}; they are kept "
                     f"in {Path(unlogged[0][1]).parent}")
        if left == 0:
            try:
                self.experiment.set_terminated(self.run_id, status)
                return
            except Exception as exc:
                if outbox is None:
                    raise
                log.debug(f"set_terminated failed: {exc}")
                outbox._write_journal(status)
        warn(f"the tracking store {self._tracking_uri} did not come back within {self.flush_timeout:g} s: {left} "
             f"metric values of MLflow run {self.run_id} and its final status ({status}) are kept in "
             f"{outbox.journal}; send them when it is back: python -m lit.tracking_sync send {outbox.journal}")

    def _reopen_run(self) -> None:
        from mlflow.exceptions import MlflowException

        try:
            run = self._mlflow_client.get_run(self._run_id)
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
            run = None
        if run is None or run.info.lifecycle_stage == "deleted":
            if self._run_origin is None:
                raise UserInputError(f"MLflow run {self._run_id} does not exist in {self._tracking_uri}; "
                                     "pass the run_id of an existing run, or none to start a new one")
            path, logged_to = self._run_origin
            elsewhere = f" (it was logged to {logged_to})" if logged_to and logged_to != self._tracking_uri else ""
            warn(f"MLflow run {self._run_id} of checkpoint {path} is not in {self._tracking_uri}{elsewhere}; "
                 "logging to a new run")
            self._run_id = None
            return
        self.continued = True
        if run.info.status != "RUNNING":
            # The UI should show it training again, and MLflow's system-metrics thread stops sampling
            # as soon as it sees a run that is not RUNNING.
            self._mlflow_client.update_run(self._run_id, status="RUNNING")

    def continue_run(self, run_id: str, checkpoint: str, logged_to: str | None = None) -> None:
        """Log into the run that wrote ``checkpoint`` instead of a new one (resuming a training).

        A ``run_id`` passed by the user wins. If the run is not in this tracking store, a new run is
        started with a warning. Must be called before the run is first used (before ``trainer.fit``).

        Args:
            run_id: the run stored in the checkpoint.
            checkpoint: the checkpoint's path (for the warning).
            logged_to: the tracking URI the run was logged to (for the warning).
        """
        if self._run_id is not None:
            return
        self._run_id, self._run_origin = run_id, (checkpoint, logged_to)

    def use_run(self, run_id: str, experiment_id: str, continued: bool) -> None:
        """Take the run global rank 0 logs to (other ranks never create one): checkpoint folders,
        system metrics and checkpoint metadata need its id on every rank.

        Args:
            run_id: rank 0's run.
            experiment_id: rank 0's experiment.
            continued: whether the run existed before this training.
        """
        self._run_id, self._experiment_id, self.continued = run_id, experiment_id, continued

    @rank_zero_only
    def log_hyperparams(self, params: dict[str, Any] | Namespace) -> None:
        params = _flatten_dict(_convert_params(params))
        synchronous = self._log_batch_kwargs.get("synchronous", True)
        changed = log_params(self.experiment, self.run_id, params, synchronous=synchronous)
        if changed:
            warn(f"MLflow run {self.run_id} keeps its first hyperparameters; changed now: "
                 f"{describe_changes(changed)}")

    @rank_zero_only
    def _scan_and_log_checkpoints(self, checkpoint_callback: ModelCheckpoint) -> None:
        # A store that cannot take them now must not stop training: they stay on disk, unmarked, and
        # are tried again at the next checkpoint and at the end (finalize reports what is left).
        try:
            self._log_checkpoints(checkpoint_callback)
        except Exception as exc:
            warn(f"checkpoints could not be logged to MLflow now ({short_error(exc)}); they are kept on disk and "
                 f"tried again at the next checkpoint and at the end")

    def _log_checkpoints(self, checkpoint_callback: ModelCheckpoint) -> None:
        # Lightning's version keeps only files (Path.is_file), so sharded checkpoints (directories)
        # were silently never logged. Same artifact layout: <stem>/<name>, metadata.yaml, aliases.txt.
        for mtime, path, score in checkpoints_to_log(checkpoint_callback, self._logged_model_time):
            artifact_path = Path(path).stem
            if Path(path).is_dir():
                self.experiment.log_artifacts(self._run_id, path, f"{artifact_path}/{Path(path).name}")
            else:
                self.experiment.log_artifact(self._run_id, path, artifact_path)
            metadata = {
                "score": score.item() if isinstance(score, Tensor) else score,
                "original_filename": Path(path).name,
                "Checkpoint": {k: getattr(checkpoint_callback, k) for k in CHECKPOINT_SETTINGS
                               if hasattr(checkpoint_callback, k)},
            }
            aliases = ["latest", "best"] if path == checkpoint_callback.best_model_path else ["latest"]
            with tempfile.TemporaryDirectory() as tmp:
                (Path(tmp) / "metadata.yaml").write_text(yaml.dump(metadata, default_flow_style=False))
                (Path(tmp) / "aliases.txt").write_text(str(aliases))
                self.experiment.log_artifacts(self._run_id, tmp, artifact_path)
            self._logged_model_time[path] = mtime


CHECKPOINT_SETTINGS = ("monitor", "mode", "save_last", "save_top_k", "save_weights_only", "_every_n_train_steps",
                       "_every_n_val_epochs")


def checkpoints_to_log(callback: ModelCheckpoint, logged: dict[str, float]) -> list[tuple[float, str, Any]]:
    """(modification time, path, score) of the callback's checkpoints not logged since they last changed,
    oldest first. A directory (sharded checkpoint) counts as changed when any file in it did."""
    scores: dict[str, Any] = {}
    if callback.last_model_path:
        scores[callback.last_model_path] = callback.current_score
    if callback.best_model_path:
        scores[callback.best_model_path] = callback.best_model_score
    scores.update(callback.best_k_models)
    found = []
    for path, score in scores.items():
        p = Path(path)
        if p.is_file():
            mtime = p.stat().st_mtime
        elif p.is_dir():
            mtime = max((f.stat().st_mtime for f in p.rglob("*") if f.is_file()), default=None)
        else:
            continue
        if mtime is not None and (path not in logged or logged[path] < mtime):
            found.append((mtime, path, score))
    return sorted(found, key=lambda item: item[:2])


def log_params(client: MlflowClient, run_id: str, params: dict[str, Any],
               synchronous: bool = True) -> dict[str, tuple[str, str]]:
    """Log the params the run does not have yet (values up to MLflow's 6000 characters).

    MLflow params cannot change, so a continued run keeps its first values. Returns
    ``{key: (value in the run, value now)}`` for those that differ.
    """
    from mlflow.entities import Param

    existing = client.get_run(run_id).data.params
    values = {k: str(v)[:MAX_PARAM_LENGTH] for k, v in params.items()}
    new = [Param(k, v) for k, v in values.items() if k not in existing]
    for i in range(0, len(new), 100):  # MLflow's limit per batch
        client.log_batch(run_id, params=new[i:i + 100], synchronous=synchronous)
    return {k: (existing[k], v) for k, v in values.items() if k in existing and existing[k] != v}


def describe_changes(changed: dict[str, tuple[str, str]], limit: int = 5) -> str:
    shown = ", ".join(f"{k} ({old[:40]} -> {new[:40]})" for k, (old, new) in list(changed.items())[:limit])
    return shown + (f" and {len(changed) - limit} more" if len(changed) > limit else "")


def resolve_tracking_uri(given: str | None) -> str:
    """The store a run, a sweep or a comparison uses: the URI given, else ``$MLFLOW_TRACKING_URI`` (read now,
    not at import), else ``sqlite:///mlflow.db``; a relative sqlite path is resolved against this folder."""
    return absolute_sqlite(given or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI)


def absolute_sqlite(uri: str) -> str:
    """``sqlite:///mlflow.db`` -> ``sqlite:////abs/path/mlflow.db``: the launch folder is resolved once.

    MLflow caches one database engine per URI string, so a relative URI would keep writing to the
    first folder's database in a process that changes directory (notebooks, tests).
    """
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/") and ":memory:" not in uri:
        return prefix + str(Path(uri[len(prefix):]).resolve())
    return uri


def sqlite_creation_lock(uri: str) -> AbstractContextManager:
    """A lock across the processes of this machine for a sqlite URI (nothing for other stores).

    The lock file lives in the temp folder, named after the database path, not beside the database.
    """
    prefix = "sqlite:///"
    if not uri.startswith(prefix) or ":memory:" in uri:
        return nullcontext()
    digest = hashlib.sha1(uri[len(prefix):].encode()).hexdigest()[:16]
    return FileLock(Path(tempfile.gettempdir()) / f"arch-lab-mlflow-{digest}.lock")


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and v:
            out.update(_flatten(v, key))
        else:
            out[key] = v
    return out


def git_commit() -> tuple[str, bool] | None:
    """(commit, dirty) of the checkout the running code comes from, or None outside one."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                                check=True, cwd=CODE_DIR).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                text=True, timeout=5, check=True, cwd=CODE_DIR).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit, bool(status)


def provenance_tags(model: nn.Module) -> dict[str, str]:
    """The plugins ``model`` is built from (name, package, version) and the git commit, as MLflow tags."""
    tags = {}
    for spec in {s for m in model.modules() for s in getattr(m, "plugin_specs", ())}:
        tags[f"plugin.{spec.kind}"] = spec.name
        tags[f"plugin.{spec.kind}.package"] = spec.origin
    commit = git_commit()
    if commit:
        tags["mlflow.source.git.commit"] = commit[0]
        tags["git.dirty"] = str(commit[1]).lower()
    return tags


class LogConfigToMLflow(SaveConfigCallback):
    """Logs the fully resolved config into each MLflow run: as ``config.yaml`` and as flattened params.

    Also tags the run with the plugins used and the git commit. Runs on rank 0 only (no collectives).
    A continued run (``fit --ckpt_path``) keeps its ``config.yaml`` and params; the new launch's config
    is logged beside it as ``config.resume-<n>.yaml``.
    """

    def __init__(self, parser, config, config_filename: str = "config.yaml", overwrite: bool = False,
                 multifile: bool = False, save_to_log_dir: bool = False):
        # A shared log_dir file collides between runs (Lightning #20184): the run is the place for it.
        super().__init__(parser, config, config_filename, overwrite, multifile, save_to_log_dir=False)

    def save_config(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        from mlflow.entities import RunTag

        for logger in trainer.loggers:
            if not isinstance(logger, MLFlowLogger):
                continue
            client, run_id = logger.experiment, logger.run_id
            stem, suffix = os.path.splitext(self.config_filename)
            earlier = [a.path for a in client.list_artifacts(run_id)
                       if a.path == self.config_filename or a.path.startswith(f"{stem}.resume-")]
            filename = f"{stem}.resume-{len(earlier)}{suffix}" if earlier else self.config_filename
            dumped = self.parser.dump(self.config, skip_none=False)
            client.log_text(run_id, dumped, filename)
            # Params from the dump, as config.yaml shows them: values linked from the data at
            # instantiation are left out there (the model's hyperparameters hold them).
            params = {k: v for k, v in _flatten(yaml.safe_load(dumped)).items() if k not in NOT_PARAMS}
            changed = log_params(client, run_id, params)
            if changed:
                warn(f"MLflow run {run_id} continues with other settings than it has as params: "
                     f"{describe_changes(changed)}; this launch's config is {filename}")
            client.log_batch(run_id, tags=[RunTag(k, v) for k, v in provenance_tags(pl_module).items()])
