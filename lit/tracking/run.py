"""One MLflow run per training, however many processes, continued on resume, with system metrics.

Lightning's MLflow logger creates its run on global rank 0 only (``experiment`` is
``rank_zero_experiment``): the other ranks never learn the run id, so they cannot name the run's
checkpoint folder, write it into checkpoints or log system metrics of their node into it. And a
resumed training (``fit --ckpt_path``) starts a new run, because the run is created when fit sets up,
before Lightning reads the checkpoint. ``MLflowRun`` shares rank 0's run with every rank and writes
it into every checkpoint; ``continue_checkpoint_run`` makes the logger reuse it before fit starts. Each
checkpoint also keeps the metrics not yet sent, logged on resume if MLflow lacks them
(``checkpointed_metrics.py``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

from lit.checkpoints import SHARDED_METADATA
from lit.errors import UserInputError
from lit.init_from import load_weights_only
from lit.tracking.checkpointed_metrics import pack, unpack
from lit.tracking.logger import MLflowLogger, warn

CHECKPOINT_KEY = "mlflow"  # {"run_id", "experiment_id", "tracking_uri"} in every checkpoint
UNSENT_KEY = "unsent_metrics"  # inside it, on rank 0: the metrics not yet sent (checkpointed_metrics.py)

log = logging.getLogger(__name__)


class MLflowRun(Callback):
    """Shares the MLflow run of global rank 0 with every rank, stores it in checkpoints and samples
    system metrics into it on local rank 0 of each node while fit runs.

    Only rank 0 writes metrics and params; the other ranks know the run id (``logger.run_id``) for the
    checkpoint folder, the checkpoint metadata and their node's system metrics. Does nothing without an
    ``lit.tracking.MLflowLogger``.
    """

    def __init__(self) -> None:
        self._monitor = None

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        logger = mlflow_logger(trainer)
        if logger is None:
            return
        # Reading run_id creates the run, so only rank 0 reads it; every rank joins the broadcast.
        run = (logger.run_id, logger.experiment_id, logger.continued) if trainer.is_global_zero else None
        logger.use_run(*trainer.strategy.broadcast(run, src=0))

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        logger = mlflow_logger(trainer)
        if logger is None or not logger.system_metrics or trainer.local_rank != 0:
            return
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        # One monitor per node: the metrics are the machine's, not the process's.
        node = f"node_{trainer.node_rank}" if trainer.num_nodes > 1 else None
        self._monitor = SystemMetricsMonitor(logger.run_id, sampling_interval=logger.system_metrics_interval,
                                             resume_logging=logger.continued, node_id=node,
                                             tracking_uri=logger.tracking_uri)
        self._monitor.start()

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._stop_monitor()

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._stop_monitor()  # before the logger marks the run FAILED

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._stop_monitor()

    def _stop_monitor(self) -> None:
        if self._monitor is None:
            return
        monitor, self._monitor = self._monitor, None
        monitor.finish()
        # MLflow drops the samples of the last, unfinished interval, so a fit shorter than one
        # interval would have no system metrics at all: log them (the run is not terminated yet).
        leftover = monitor.aggregate_metrics()
        if leftover:
            try:
                monitor.publish_metrics(leftover)
                monitor.mlflow_logger.flush()
            except Exception as exc:  # the store went away: training results matter more
                log.warning(f"could not log the last system metrics of this node: {exc}")  # any node

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        logger = mlflow_logger(trainer)
        if logger is not None and logger.run_id is not None:
            checkpoint[CHECKPOINT_KEY] = {"run_id": logger.run_id, "experiment_id": logger.experiment_id,
                                          "tracking_uri": logger.tracking_uri}
            if trainer.is_global_zero:  # the only process that logs metrics; it writes the checkpoint's metadata
                # The first step the resumed training logs: a checkpoint holds global_step optimizer steps.
                checkpoint[CHECKPOINT_KEY][UNSENT_KEY] = pack(logger.unsent_metrics(trainer), trainer.global_step)

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        logger = mlflow_logger(trainer)
        stored = checkpoint.get(CHECKPOINT_KEY)
        if logger is None or not isinstance(stored, dict) or UNSENT_KEY not in stored or not trainer.is_global_zero:
            return
        if trainer.state.fn != "fit":  # validating or testing a checkpoint resumes no training
            return
        if stored.get("run_id") != logger.run_id:  # logging to another run (the user's run_id, or a new one)
            return
        logger.restore_unsent(*unpack(stored[UNSENT_KEY]))


def mlflow_logger(trainer: Trainer) -> MLflowLogger | None:
    return next((lg for lg in trainer.loggers if isinstance(lg, MLflowLogger)), None)


def continue_checkpoint_run(trainer: Trainer, ckpt_path: str | Path | None) -> None:
    """Make the trainer's MLflow logger continue the run that wrote ``ckpt_path``.

    Call it before ``trainer.fit(..., ckpt_path=...)``: the run is created when fit sets up, before
    Lightning restores the checkpoint. Every process may call it (it reads the checkpoint only); rank 0
    checks that the run exists when it opens it and starts a new one with a warning if not. A run_id
    given to the logger wins.

    Args:
        trainer: the trainer about to fit.
        ckpt_path: the checkpoint to resume from: a file, or a sharded checkpoint's directory. Other
            values (None, "last", a registry name) are left alone.
    """
    logger = mlflow_logger(trainer)
    if logger is None or ckpt_path is None or not Path(ckpt_path).exists():
        return
    stored = checkpoint_run(ckpt_path)
    if stored is not None:
        logger.continue_run(stored["run_id"], str(ckpt_path), stored.get("tracking_uri"))


def checkpoint_run(ckpt_path: str | Path) -> dict[str, str] | None:
    """The MLflow run stored in a checkpoint (file or sharded directory), or None.

    Loaded weights-only and memory-mapped: nothing but plain data is unpickled, and the tensors are
    not read.
    """
    path = Path(ckpt_path)
    if path.is_dir():
        path = path / SHARDED_METADATA
    if not path.is_file():
        return None
    try:
        checkpoint = load_weights_only(path)
    except UserInputError as exc:  # an old or foreign format: the training can still resume, in a new run
        warn(f"could not read the MLflow run from {ckpt_path} ({exc}); logging to a new run")
        return None
    stored = checkpoint.get(CHECKPOINT_KEY) if isinstance(checkpoint, dict) else None
    if not isinstance(stored, dict) or not stored.get("run_id"):
        return None
    return {k: v for k, v in stored.items() if k != UNSENT_KEY}  # the run, not the metrics kept for it
