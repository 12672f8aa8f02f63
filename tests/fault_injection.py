"""Faults injected into real training runs by tests, as callbacks named on the command line.

    --trainer.callbacks='[{class_path: tests.fault_injection.SigkillAtStep, init_args: {step: 7}}]'
"""

from __future__ import annotations

import os
import signal
import time

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


class SignalAtStep(L.Callback):
    """Sends ``signal`` (SIGTERM, SIGUSR1 or SIGINT, as from a scheduler or Ctrl-C) to this process when training
    reaches ``step``: it arrives in the middle of that step, as a real one does."""

    def __init__(self, step: int, signal: str = "SIGTERM"):
        self.step, self.signal = step, signal

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), getattr(signal, self.signal))


class SlowSteps(L.Callback):
    """Makes every training step last at least ``seconds`` (a clock-based checkpoint then falls between steps)."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        time.sleep(self.seconds)


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


# The test's MLflow server (tests/mlflow_server.py) by name, and what ServerOutage saw: a callback named on the
# command line is built by the CLI, so the server reaches it through this module.
SERVERS: dict = {}
OBSERVED: dict = {}


class ServerOutage(L.Callback):
    """Stops the MLflow server ``SERVERS[name]`` when training reaches ``stop_at`` and starts it again at ``start_at``
    without waiting for it to be up. Before starting it, waits (at most ``patience`` seconds) until the logger has
    kept the unsent metrics on disk, and records whether it had (``OBSERVED["journal_during_outage"]``)."""

    def __init__(self, stop_at: int, start_at: int, patience: float = 60.0, name: str = "mlflow"):
        self.stop_at, self.start_at, self.patience, self.name = stop_at, start_at, patience, name

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        step, server = trainer.global_step, SERVERS[self.name]
        if step == self.stop_at:
            server.stop()
        if step == self.start_at:
            journal, deadline = trainer.logger._unsent_file(), time.time() + self.patience
            while not journal.is_file() and time.time() < deadline:
                time.sleep(0.2)
            OBSERVED["journal_during_outage"] = journal.is_file()
            server.start(wait=False)
