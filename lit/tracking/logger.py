"""``MLflowLogger``: Lightning's MLflow logger made to work out of the box on MLflow 3.x and to lose nothing.

- A bare ``MLFlowLogger()`` falls back to the ``./mlruns`` file store, which MLflow >= 3.13 refuses:
  ``MLflowLogger`` defaults to ``sqlite:///mlflow.db`` (or ``MLFLOW_TRACKING_URI``, read when the
  logger is built, not when Lightning is imported).
- With a non-file URI, ``MLFlowLogger.save_dir`` is None, so LightningCLI's ``SaveConfigCallback``
  asserts and checkpoints land in a folder named after the experiment id. ``MLflowLogger`` keeps a
  local ``save_dir`` for checkpoints (``<save_dir>/<experiment_id>/<run_id>/checkpoints``) and
  ``LogConfigToMLflow`` (``config_log.py``) writes the resolved config into the run instead of a shared file.
- Logging is asynchronous by default (a step never waits for the store); a continued run keeps its
  params (MLflow forbids changing them); sharded checkpoints, which are directories, are logged as
  artifacts too (Lightning skips them).
- The experiments it creates say they are model training (``names.TRAINING_EXPERIMENT``), so MLflow's
  UI opens them on runs and charts.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
import time
from argparse import Namespace
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from lightning.fabric.utilities.logger import _add_prefix
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from torch import Tensor

from lit.errors import UserInputError
from lit.tracking.batches import MAX_METRICS_PER_BATCH, batches
from lit.tracking.checkpointed_metrics import lightning_logs_next
from lit.tracking.history import logged_steps
from lit.tracking.names import EXPERIMENT_KIND, MEANT_FOR, RESUME_FROM, STOPPED_AT_STEP, STOPPED_BY, TRAINING_EXPERIMENT
from lit.tracking.outbox import MetricOutbox, short_error
from lit.tracking.params import describe_changes, flatten, log_params
from lit.tracking.reachability import fail_fast, is_remote, unreachable_message, unreachable_reason
from lit.tracking.ui import where_to_look
from lit.tracking.uri import DEFAULT_TRACKING_URI, absolute_sqlite, resolve_tracking_uri, sqlite_creation_lock

if TYPE_CHECKING:
    from lightning.pytorch import Trainer
    from mlflow import MlflowClient
    from mlflow.entities import Metric

ASYNC_BUFFERING = "MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS"
UNSENT_METRICS = "unsent_metrics.jsonl"  # in the run's folder, beside checkpoints/, while the store is down
FINAL_STATUS = {"success": "FINISHED", "finished": "FINISHED", "failed": "FAILED"}

# One logger for the package's warnings, whatever module says them: one name to silence or to capture.
log = logging.getLogger("lit.tracking")


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
            (``python cli.py sync send FILE`` sends it).
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
        self._checkpoint_since_send = False  # a checkpoint was written since the last metrics were put
        self._in_store: set[tuple[str, int]] = set()  # (key, step) MLflow had at a resume, past the checkpoint
        self._in_store_until = -1  # the last step in _in_store
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
        if created:
            declare_training_experiment(client, self._experiment_id)
        if created and self.fallback_from is not None:
            client.set_tag(self._run_id, MEANT_FOR, self.fallback_from)
            warn(f"MLflow run {self._run_id} is in the local store {self._tracking_uri}; when "
                 f"{self.fallback_from} is back, copy it there with: python cli.py sync run "
                 f"{self._run_id} --from {self._tracking_uri} --to {self.fallback_from}")
        return client

    def _unsent_file(self) -> Path:
        return Path(self._local_dir) / str(self.experiment_id) / str(self.run_id) / UNSENT_METRICS

    def _metric_batch(self, metrics: Mapping[str, float], step: int | None) -> list[Metric]:
        from mlflow.entities import Metric

        now, batch = int(time.time() * 1000), []
        for key, value in _add_prefix(metrics, self._prefix, self.LOGGER_JOIN_CHAR).items():
            if isinstance(value, str):
                log.warning(f"Discarding metric with string value {key}={value}.")
                continue
            # MLflow's allowed characters, as Lightning's logger does.
            batch.append(Metric(re.sub("[^a-zA-Z0-9_/. -]+", "", key), float(value), now, step or 0))
        return batch

    def _outbox_or_new(self) -> MetricOutbox:
        if self._outbox is None:
            self._outbox = MetricOutbox(self.experiment, self.run_id, self._unsent_file())
        return self._outbox

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        if self._log_batch_kwargs.get("synchronous") is not False and not self._in_store:
            return super().log_metrics(metrics, step)
        batch = self._metric_batch(metrics, step)
        if self._in_store:  # a resumed training logs again the steps it trains again; MLflow keeps the first
            batch = [m for m in batch if (m.key, m.step) not in self._in_store]
            if (step or 0) > self._in_store_until:
                self._in_store = set()  # past the steps MLflow had: nothing more to drop
        if self._log_batch_kwargs.get("synchronous") is not False:
            if batch:
                self.experiment.log_batch(self.run_id, metrics=batch, **self._log_batch_kwargs)
            return
        outbox = self._outbox_or_new()
        outbox.put(batch)
        if self._checkpoint_since_send:
            # What Lightning logs after a checkpoint's step (checkpointed_metrics.py) goes now, not within the second.
            self._checkpoint_since_send = False
            outbox.send_soon()

    def unsent_metrics(self, trainer: Trainer) -> list[Metric]:
        """What a checkpoint written now keeps (``checkpointed_metrics.py``): the values logged but not yet confirmed
        sent, and those Lightning logs at the end of the current batch. Rank 0 only (the others log nothing)."""
        self._checkpoint_since_send = True
        unsent = self._outbox.unsent() if self._outbox is not None else []
        upcoming = lightning_logs_next(trainer)
        if upcoming is not None:
            unsent += self._metric_batch(*upcoming)
        return unsent

    @rank_zero_only
    def restore_unsent(self, unsent: list[Metric], resume_step: int) -> None:
        """Log the values a checkpoint kept that MLflow does not have (a SIGKILL came before they were sent), and
        drop, from now on, the values of the steps from ``resume_step`` on that it has (sent before the kill, now
        trained and logged again): each step once."""
        client = self.experiment
        try:
            stored = logged_steps(client, self.run_id, {m.key for m in unsent})
        except Exception as exc:  # the store is away: nothing is lost, a step may be logged twice
            warn(f"could not read the metric history of MLflow run {self.run_id} ({short_error(exc)}); the "
                 f"{len(unsent)} values its checkpoint kept are logged again as they are")
            stored = set()
        self._in_store = {(key, step) for key, step in stored if step >= resume_step}
        self._in_store_until = max((step for _, step in self._in_store), default=-1)
        missing = [m for m in unsent if (m.key, m.step) not in stored]
        if not missing:
            return
        if self._log_batch_kwargs.get("synchronous") is not False:
            for part in batches(missing, MAX_METRICS_PER_BATCH):
                client.log_batch(self.run_id, metrics=part, **self._log_batch_kwargs)
        else:
            self._outbox_or_new().put(missing)

    @rank_zero_only
    def mark_interrupted(self, signal_name: str, step: int, checkpoint: str) -> None:
        """Training was stopped by ``signal_name`` after saving ``checkpoint``: the run ends KILLED, tagged."""
        self._final_status = "KILLED"
        if not self._initialized:
            return
        from mlflow.entities import RunTag

        tags = {STOPPED_BY: signal_name, STOPPED_AT_STEP: str(step), RESUME_FROM: checkpoint}
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
                print(f"run {self.run_id} {where_to_look(self._tracking_uri, self.experiment_id, self.run_id)}",
                      flush=True)
                return
            except Exception as exc:
                if outbox is None:
                    raise
                log.debug(f"set_terminated failed: {exc}")
                outbox.keep(status)
        warn(f"the tracking store {self._tracking_uri} did not come back within {self.flush_timeout:g} s: {left} "
             f"metric values of MLflow run {self.run_id} and its final status ({status}) are kept in "
             f"{outbox.journal}; send them when it is back: python cli.py sync send {outbox.journal}")

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
        params = flatten(params or {}, delimiter="/")  # Lightning's key names for hyperparameters
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


def declare_training_experiment(client: MlflowClient, experiment_id: str) -> None:
    """Tag the experiment as model training, unless it already says what it is (a user's choice wins)."""
    if EXPERIMENT_KIND not in client.get_experiment(experiment_id).tags:
        for key, value in TRAINING_EXPERIMENT.items():
            client.set_experiment_tag(experiment_id, key, value)
