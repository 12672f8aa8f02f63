"""Which training batches may read the device: the ones at whose end Lightning writes the logs.

Reading a device value on the host (``.item()``, ``bool(t)``, ``.tolist()``) waits for every queued kernel: on a GPU
the queue drains and the device idles while the host catches up. Lightning itself reads every logged metric at its log
steps, once every ``log_every_n_steps`` optimizer steps, so whatever else must be read (the non-finite flag, the spike
statistics, the processes' agreement on a preemption signal, the learning rate and throughput) is read there too:
one drain per log interval instead of one per micro-batch. ``tests/test_syncs.py`` holds every other batch to zero.

With logging off (``log_every_n_steps: 0``) these reads still happen, every ``UNLOGGED_INTERVAL`` optimizer steps,
so that a diverged run still stops in bounded time.
"""

from __future__ import annotations

import lightning as L

UNLOGGED_INTERVAL = 50  # Lightning's default log_every_n_steps


def check_interval(trainer: L.Trainer) -> int:
    """Optimizer steps between two reads: ``log_every_n_steps``, or ``UNLOGGED_INTERVAL`` with logging off."""
    return trainer.log_every_n_steps or UNLOGGED_INTERVAL


def is_log_step(trainer: L.Trainer) -> bool:
    """Whether the current training batch (called from ``training_step`` up to ``on_train_batch_end``) is the last
    micro-batch of an optimizer step at whose end Lightning writes the logged metrics (or would, with logging off).

    The same on every process (it depends only on the step counters), so a collective taken on it cannot hang.
    """
    loop = trainer.fit_loop
    if loop._should_accumulate():
        return False
    if trainer.log_every_n_steps:
        return trainer._logger_connector.should_update_logs or bool(trainer.fast_dev_run)
    return (loop.epoch_loop._batches_that_stepped + 1) % UNLOGGED_INTERVAL == 0
