"""Stops that lose nothing: preemption signals and Ctrl-C save a resumable checkpoint, and a clock bounds a kill.

Clusters stop jobs with SIGTERM (and SLURM warns with SIGUSR1 before its time limit); people press
Ctrl-C. Lightning's own handling of these stops training without saving (SIGTERM) or tears down from
the middle of a step (Ctrl-C). Here a signal only raises a flag; at the end of the current batch (with several
processes, of the next log step; a consistent state: the optimizer step is done and counted) every process saves
``last.ckpt`` exactly as
``ModelCheckpoint`` would, the MLflow run is marked KILLED with the signal and the step, and training
ends with one line naming the checkpoint. Resuming from it is exact (tests/test_resume.py).

- SIGUSR1 under SLURM, when Lightning's SLURM environment asks for requeueing (its default), saves
  Lightning's ``hpc_ckpt_<n>.ckpt`` instead and requeues the job (``scontrol requeue``): the requeued job
  resumes from it with no ``--ckpt_path``, as Lightning does.
- A second Ctrl-C stops at once, without saving.
- ``interval_minutes``: ``last.ckpt`` is also refreshed when that much training time passed since the
  last checkpoint of any kind, so a SIGKILL (out of memory, a node lost) loses at most that much.

All processes take each decision together, as a save is collective. With one process the decision is the flag's and
the clock's, host values, at the end of every batch. With several, agreeing is an all-reduce, which waits for the
slowest process and, on a GPU, syncs the host with the device; so it is taken only at log steps (``lit/log_steps.py``,
where Lightning syncs anyway): a signal is acted on at most ``log_every_n_steps`` optimizer steps after it arrives
(50 with logging off). Keep the scheduler's grace period (SLURM's ``--signal=...@90``, Kubernetes'
``terminationGracePeriodSeconds``) above that many steps' time plus a checkpoint's.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import lightning as L
import torch
import torch.distributed as dist
from lightning.fabric.plugins.environments import SLURMEnvironment

from lit.log_steps import is_log_step

log = logging.getLogger(__name__)

SIGNALS = {"SIGTERM": signal.SIGTERM, "SIGUSR1": signal.SIGUSR1, "SIGINT": signal.SIGINT}


class Interrupted(Exception):
    """Training stopped on a signal after saving; ``str(e)`` names the checkpoint, ``exit_code`` is 128 + signal."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.exit_code = 128 + signum


class PreemptionCheckpoints(L.Callback):
    """Args:
        interval_minutes: refresh ``last.ckpt`` after this many minutes of training without a checkpoint
            (0: only at validation and on signals).
        signals: the signals that save and stop (SIGTERM, SIGUSR1, SIGINT).
        requeue: on SIGUSR1 under SLURM, requeue the job; None: when Lightning's SLURM environment has
            ``auto_requeue`` (its default).
    """

    def __init__(self, interval_minutes: float = 10.0, signals: tuple[str, ...] = ("SIGTERM", "SIGUSR1", "SIGINT"),
                 requeue: bool | None = None):
        unknown = set(signals) - set(SIGNALS)
        if unknown:
            from lit.errors import UserInputError

            raise UserInputError(f"unknown signals {sorted(unknown)}; choose among {', '.join(SIGNALS)}")
        if interval_minutes < 0:
            from lit.errors import UserInputError

            raise UserInputError(f"interval_minutes must be >= 0 (0: off), got {interval_minutes}")
        self.interval_s, self.signals, self.requeue = interval_minutes * 60, tuple(signals), requeue
        self._received: int | None = None
        self._previous: dict[int, object] = {}
        self._silenced = None  # the training loop whose per-batch SIGTERM broadcast is skipped while we handle it
        self._last_save = time.monotonic()

    # --- signals -------------------------------------------------------------------------------------------------

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last_save, self._received = time.monotonic(), None
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread
        # After Lightning registered its own (fit start), which would stop without saving: they are replaced.
        for name in self.signals:
            self._previous[SIGNALS[name]] = signal.signal(SIGNALS[name], self._on_signal)
        if "SIGTERM" in self.signals:
            # With several processes Lightning broadcasts rank 0's SIGTERM flag before every batch: a collective
            # and a host-device sync per micro-batch. Its SIGTERM handler, the only thing that sets the flag, was
            # replaced just above, so the broadcast could only ever send 0; this callback agrees instead, at log
            # steps (module docstring).
            loop = trainer.fit_loop.epoch_loop
            if hasattr(loop, "_broadcast_sigterm_tensor"):
                loop._broadcast_sigterm_tensor = _nothing
                self._silenced = loop

    def _on_signal(self, signum: int, frame) -> None:
        if self._received is not None and signum == signal.SIGINT:
            self._restore()
            raise KeyboardInterrupt  # a second Ctrl-C: stop now
        if self._received is None:
            log.warning(f"received {signal.Signals(signum).name}: saving a checkpoint at the end of this batch")
        self._received = signum

    def _restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
        loop, self._silenced = self._silenced, None
        if loop is not None:
            del loop._broadcast_sigterm_tensor  # Lightning's own method again

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._restore()

    # --- decisions at the end of each batch -------------------------------------------------------------------------

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        self._last_save = time.monotonic()  # any checkpoint restarts the clock

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch,
                           batch_idx: int) -> None:
        if self._several(trainer) and not is_log_step(trainer):
            return  # agreeing is a collective: only at log steps (module docstring)
        due = self.interval_s > 0 and time.monotonic() - self._last_save >= self.interval_s
        signum, due = self._agree(trainer, self._received or 0, due)
        if signum:
            self._stop(trainer, signum)
        elif due:
            self._save_last(trainer)

    @staticmethod
    def _several(trainer: L.Trainer) -> bool:
        return trainer.world_size > 1 and dist.is_available() and dist.is_initialized()

    @classmethod
    def _agree(cls, trainer: L.Trainer, signum: int, due: bool) -> tuple[int, bool]:
        if not cls._several(trainer):
            return signum, due
        flags = torch.tensor([signum, int(due)], device=trainer.strategy.root_device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        signum, due = flags.tolist()
        return int(signum), bool(due)

    def _save_last(self, trainer: L.Trainer) -> str:
        saved = None
        for cb in trainer.checkpoint_callbacks:
            if getattr(cb, "save_last", False):
                cb._save_last_checkpoint(trainer, cb._monitor_candidates(trainer))
                saved = cb.last_model_path
        if saved is None:  # checkpointing turned off: still leave something to resume from
            saved = str(Path(trainer.default_root_dir) / "interrupted.ckpt")
            trainer.save_checkpoint(saved)
        return saved

    def _stop(self, trainer: L.Trainer, signum: int) -> None:
        name = signal.Signals(signum).name
        requeue = signum == signal.SIGUSR1 and self._slurm_requeue(trainer)
        if requeue:
            path = trainer._checkpoint_connector.hpc_save_path(trainer.default_root_dir)
            trainer.save_checkpoint(path)
        else:
            path = self._save_last(trainer)
        step = trainer.global_step
        for logger in trainer.loggers:
            mark = getattr(logger, "mark_interrupted", None)
            if mark is not None:
                mark(name, step, path)
        how = ("the job is requeued and resumes from it by itself" if requeue and _requeue(trainer)
               else f"resume with the same command and --ckpt_path={path}")
        raise Interrupted(f"stopped by {name} at step {step}; checkpoint {path}; {how}", signum)

    def _slurm_requeue(self, trainer: L.Trainer) -> bool:
        if self.requeue is not None:
            return self.requeue and SLURMEnvironment.detect()
        env = trainer._accelerator_connector.cluster_environment
        return isinstance(env, SLURMEnvironment) and env.auto_requeue


def _nothing() -> None:
    pass


def _requeue(trainer: L.Trainer) -> bool:
    """``scontrol requeue`` this job (from global rank 0); True when SLURM accepted it."""
    if not trainer.is_global_zero:
        return True
    array = os.environ.get("SLURM_ARRAY_JOB_ID")
    job = f"{array}_{os.environ['SLURM_ARRAY_TASK_ID']}" if array else os.environ["SLURM_JOB_ID"]
    try:
        result = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning(f"could not requeue SLURM job {job}: {exc}")
        return False
    if result.returncode != 0:
        log.warning(f"could not requeue SLURM job {job}: {result.stderr.strip()}")
    return result.returncode == 0
