"""Faults injected into real training runs by tests, as callbacks named on the command line.

    --trainer.callbacks='[{class_path: tests.fault_injection.SigkillAtStep, init_args: {step: 7}}]'
"""

from __future__ import annotations

import os
import signal

import lightning as L
import torch


class SigkillAtStep(L.Callback):
    """Kills this process with SIGKILL (no cleanup, no handler runs) when training reaches ``step``.

    It fires at the start of the batch after ``step`` optimizer steps, so the checkpoint of that step (if
    one was due) is already on disk and the next update is lost, as in a real crash.
    """

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


class PoisonWeightsAtStep(L.Callback):
    """Sets one weight to NaN before the forward pass of ``step`` (on one ``rank`` only, or on all): the loss of
    that step is NaN there."""

    def __init__(self, step: int, rank: int | None = None):
        self.step, self.rank = step, rank

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        if trainer.global_step == self.step and self.rank in (None, trainer.global_rank):
            with torch.no_grad():
                next(pl_module.parameters()).fill_(float("nan"))


class LossSpikeAtStep(L.Callback):
    """Multiplies the training loss of ``step`` by ``factor`` (and so its gradient): one loss and gradient-norm spike
    that leaves the weights nearly where they were (Adam's update hardly depends on the gradient's scale)."""

    def __init__(self, step: int, factor: float = 10.0):
        self.step, self.factor = step, factor

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        if trainer.global_step != self.step:
            return
        original = type(pl_module).training_step

        def scaled(*args, **kwargs):
            del pl_module.training_step  # this batch only
            return original(pl_module, *args, **kwargs) * self.factor

        pl_module.training_step = scaled
