"""Metrics that travel inside checkpoints, so that what a checkpoint contains, MLflow has, even after a SIGKILL.

The outbox (``outbox.py``) sends once a second: a SIGKILL loses the metrics logged since its last send. Steps after
the last checkpoint are trained and logged again on resume, but steps before it are not: their values were lost for
good (a hole in ``train/loss`` where the weights resumed exactly). So every checkpoint carries the values not yet
confirmed sent (``MLflowRun.on_save_checkpoint``), and the resumed training logs those that MLflow does not have.

- Lightning hands a training step's metrics to the loggers after that step's ``on_train_batch_end`` hooks, where
  checkpoints are saved: the checkpoint's own last step is not in the outbox yet. ``lightning_logs_next`` reads
  those values as Lightning is about to log them. What the LightningModule logs in its own ``on_train_batch_end``
  (after the callbacks': throughput, MFU) is not there yet either, nor the training-epoch aggregates of an
  end-of-epoch checkpoint; the logger sends those at once instead of within the second.
- The checkpoint's values are read on the host when it is written, which syncs with the device as writing the
  weights does; steps without a checkpoint are untouched.
- Kept as columns of tensors: loadable weights-only (``lit/init_from.py``) and small even after an outage of hours.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from lightning.fabric.utilities.apply_func import convert_tensors_to_scalars

if TYPE_CHECKING:
    from lightning.pytorch import Trainer
    from mlflow.entities import Metric


def pack(metrics: list[Metric], resume_step: int) -> dict[str, Any]:
    """``metrics`` as a checkpoint keeps them; ``resume_step``: the first step the resumed training logs."""
    keys = sorted({m.key for m in metrics})
    index = {key: i for i, key in enumerate(keys)}
    return {"keys": keys, "resume_step": resume_step,
            "key": torch.tensor([index[m.key] for m in metrics], dtype=torch.int32),
            "value": torch.tensor([m.value for m in metrics], dtype=torch.float64),
            "timestamp": torch.tensor([m.timestamp for m in metrics], dtype=torch.int64),
            "step": torch.tensor([m.step for m in metrics], dtype=torch.int64)}


def unpack(packed: dict[str, Any]) -> tuple[list[Metric], int]:
    """The metrics ``pack`` kept, and the step the resumed training logs first."""
    from mlflow.entities import Metric

    keys = packed["keys"]
    metrics = [Metric(keys[k], v, t, s) for k, v, t, s in zip(packed["key"].tolist(), packed["value"].tolist(),
                                                                 packed["timestamp"].tolist(),
                                                                 packed["step"].tolist(), strict=True)]
    return metrics, int(packed["resume_step"])


def lightning_logs_next(trainer: Trainer) -> tuple[dict[str, float], int] | None:
    """The metrics Lightning writes to the loggers at the end of the current training batch, and their step, when
    called from that batch's ``on_train_batch_end`` hooks (where ``ModelCheckpoint`` and the preemption callback
    save); None elsewhere, or when this batch logs nothing.

    Lightning's own decision and naming (``_LoggerConnector.update_train_step_metrics`` and ``log_metrics``),
    read rather than recomputed: the values are those it caches for the step, nothing is computed again.
    """
    loop = trainer.fit_loop.epoch_loop
    progress = loop.batch_progress.current
    if not trainer.training or progress.processed <= progress.completed:  # not between a step and its logging
        return None
    connector = trainer._logger_connector
    if loop._should_accumulate() and trainer.lightning_module.automatic_optimization:
        return None
    if not (connector.should_update_logs or trainer.fast_dev_run):
        return None
    metrics = convert_tensors_to_scalars(connector.metrics["log"])
    if not metrics:
        return None
    step = metrics.pop("step", None)
    if step is not None:
        return metrics, int(step)
    metrics.setdefault("epoch", trainer.current_epoch)
    return metrics, loop._batches_that_stepped
