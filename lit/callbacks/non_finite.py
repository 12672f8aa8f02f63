"""Stops a run whose loss is no longer a number, before anything is saved from it, without reading the device per step.

A NaN or infinite loss poisons the weights through the update that follows it, and every checkpoint written
afterwards. Checking it the obvious way (``bool(torch.isfinite(loss))`` per batch) is a host-device sync per
micro-batch, which on a GPU drains the queue every time. So the flag stays on the device: every micro-batch folds
its loss into ``first bad step`` (a device integer, three tiny kernels, no sync), and the flag is read only where a
read costs nothing extra or where it must be:

- at every log step (``lit/log_steps.py``: where Lightning reads the logged metrics anyway). Training therefore stops
  at most ``log_every_n_steps`` optimizer steps after the first non-finite loss (50 with logging off), at the end of
  that log step's batch, before its metrics are written: no non-finite ``train/loss`` reaches the logger;
- before every checkpoint is written (``on_save_checkpoint``, which every save path calls, ``ModelCheckpoint``'s,
  the preemption callback's and ``trainer.save_checkpoint``'s): a checkpoint of poisoned weights is never written,
  the last one on disk is the last good one;
- before validation (validating poisoned weights would only waste time) and when training ends.

The error names the first step whose loss was non-finite (``NonFiniteLossError.step``; a sweep records it as the
run's outcome), not the step it was found at. All processes take the decision together (one all-reduce at each of
those reads, none in between): the loss may be non-finite on one process only, and a process that stopped alone
would leave the others waiting in a collective forever.
"""

from __future__ import annotations

import math
from pathlib import Path

import lightning as L
import torch
import torch.distributed as dist

from lit.errors import UserInputError
from lit.log_steps import check_interval, is_log_step

NO_STEP = 2**62  # "no non-finite loss yet", larger than any step


class NonFiniteLossError(UserInputError):
    """The run diverged; the message names the step and the checkpoint to resume from.

    ``step`` is the first step whose loss was not a number. A sweep records it as the run's outcome
    (``lit/sweep/child.py``): in a tuning grid a diverging value is a result, not a mistake.
    """

    def __init__(self, message: str, step: int | None = None):
        super().__init__(message)
        self.step = step


class StopOnNonFiniteLoss(L.Callback):
    """Ends training with one line naming the step when the training loss went NaN or infinite (see the module
    docstring for when it looks)."""

    def __init__(self) -> None:
        self._step = 0
        self._first_bad: torch.Tensor | None = None  # int64 on the loss's device: the first bad step, or NO_STEP
        self._bad_value: torch.Tensor | None = None  # float32: the loss at that step (nan, inf or -inf)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        self._step = trainer.global_step  # the step this batch's loss is logged at (before its update)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch,
                           batch_idx: int) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor):
            self._fold(loss.detach())
        if is_log_step(trainer):
            self.check(trainer)

    def _fold(self, loss: torch.Tensor) -> None:
        """Folds one micro-batch's loss into the device flag; queues kernels, reads nothing."""
        if self._first_bad is None:
            self._first_bad = torch.full((), NO_STEP, dtype=torch.long, device=loss.device)
            self._bad_value = torch.zeros((), dtype=torch.float32, device=loss.device)
        value = loss.float().sum()  # the loss itself (a 0-d loss), whatever its value when non-finite
        bad = ~torch.isfinite(value)
        first = bad & (self._first_bad == NO_STEP)
        self._bad_value = torch.where(first, value, self._bad_value)
        self._first_bad = torch.where(first, self._step, self._first_bad)

    def check(self, trainer: L.Trainer) -> None:
        """Reads the flag (and agrees on it across processes): raises ``NonFiniteLossError`` if any loss since the
        start was non-finite. Every process must call it at the same point."""
        first_bad = self._first_bad if self._first_bad is not None else torch.full(
            (), NO_STEP, dtype=torch.long, device=trainer.strategy.root_device)
        agreed = first_bad
        if trainer.world_size > 1 and dist.is_available() and dist.is_initialized():
            agreed = first_bad.clone()
            dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
        mine, step = (first_bad.item(), agreed.item()) if agreed is not first_bad else (first_bad.item(),) * 2
        if step == NO_STEP:
            return
        value = self._bad_value.item() if mine == step and self._bad_value is not None else math.nan
        what = value if mine == step else "non-finite on another process"
        raise NonFiniteLossError(
            f"training loss is {what} at step {step} (found at step {self._step}: the loss is read every "
            f"{check_interval(trainer)} steps and before every checkpoint); nothing was saved from it. "
            f"{last_good_checkpoint(trainer)}. Lower --model.lr, raise the warmup or set --trainer.gradient_clip_val, "
            f"then resume with --ckpt_path", step)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        if trainer.state.fn == "fit":  # a checkpoint written outside fit carries no training loss to check
            self.check(trainer)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self.check(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.check(trainer)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._first_bad = self._bad_value = None


def last_good_checkpoint(trainer: L.Trainer) -> str:
    paths = [Path(p) for cb in trainer.checkpoint_callbacks for p in (cb.last_model_path, cb.best_model_path) if p]
    existing = [p for p in paths if p.exists()]
    if not existing:
        return "No checkpoint was written before it"
    return f"The last good checkpoint is {max(existing, key=lambda p: p.stat().st_mtime)}"
