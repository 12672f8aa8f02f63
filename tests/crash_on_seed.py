"""A fault for one run of a sweep: the run whose seed is ``seed`` kills its own process (SIGKILL, no cleanup)
when training reaches ``step``; every other run trains as usual. Named on the sweep's command line:

    --trainer.callbacks+='{class_path: tests.crash_on_seed.SigkillOnSeed, init_args: {seed: 1338}}'
"""

from __future__ import annotations

import os
import signal

import lightning as L


class SigkillOnSeed(L.Callback):
    def __init__(self, seed: int, step: int = 1):
        self.seed, self.step = seed, step

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        # seed_everything records the run's seed in the environment (a worker puts it back after each run).
        if trainer.global_step == self.step and os.environ.get("PL_GLOBAL_SEED") == str(self.seed):
            os.kill(os.getpid(), signal.SIGKILL)
