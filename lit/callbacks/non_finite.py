"""Stops a run whose loss is no longer a number, before anything is saved from it.

A NaN or infinite loss poisons the weights through the update that follows it, and every checkpoint
written afterwards. The check runs at the end of every training batch, before ``ModelCheckpoint``
(Lightning always runs it last), so the last checkpoint on disk is the last good one. All ranks
take the decision together: the loss may be non-finite on one rank only, and a rank that stops alone
would leave the others waiting in a collective forever.
"""

from __future__ import annotations

import math
from pathlib import Path

import lightning as L
import torch

from lit.errors import UserInputError


class NonFiniteLossError(UserInputError):
    """The run diverged; the message names the step and the checkpoint to resume from.

    ``step`` is the first step whose loss was not a number. A sweep records it as the run's outcome
    (``lit/sweep/child.py``): in a tuning grid a diverging value is a result, not a mistake.
    """

    def __init__(self, message: str, step: int | None = None):
        super().__init__(message)
        self.step = step


class StopOnNonFiniteLoss(L.Callback):
    """Ends training with one line naming the step when the training loss is NaN or infinite."""

    def __init__(self) -> None:
        self._step = 0

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        self._step = trainer.global_step  # the step this batch's loss is logged at (before its update)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch,
                           batch_idx: int) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        bad = loss is not None and not bool(torch.isfinite(loss.detach()).all())
        if trainer.world_size > 1:
            bad = trainer.strategy.reduce_boolean_decision(bad, all=False)
        if not bad:
            return
        value = loss.detach().float().item() if loss is not None else math.nan
        what = "non-finite on another process" if math.isfinite(value) else value
        raise NonFiniteLossError(
            f"training loss is {what} at step {self._step} (epoch {trainer.current_epoch}, batch "
            f"{batch_idx}); nothing was saved from this step. {last_good_checkpoint(trainer)}. Lower --model.lr, "
            f"raise the warmup or set --trainer.gradient_clip_val, then resume with --ckpt_path", self._step)


def last_good_checkpoint(trainer: L.Trainer) -> str:
    paths = [Path(p) for cb in trainer.checkpoint_callbacks for p in (cb.last_model_path, cb.best_model_path) if p]
    existing = [p for p in paths if p.exists()]
    if not existing:
        return "No checkpoint was written before it"
    return f"The last good checkpoint is {max(existing, key=lambda p: p.stat().st_mtime)}"
