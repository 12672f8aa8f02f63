"""A callback that holds a training run at its start while a file exists, named on the command line by tests
that must act while a run is certainly in progress (however slow the machine is to start the next command).

    ARCH_LAB_HOLD_FILE=/tmp/hold ... --trainer.callbacks+=tests.hold.HoldWhileFileExists
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import lightning as L


class HoldWhileFileExists(L.Callback):
    """Waits at the start of training while ``$ARCH_LAB_HOLD_FILE`` exists (at most 10 minutes)."""

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        path = os.environ.get("ARCH_LAB_HOLD_FILE")
        deadline = time.monotonic() + 600
        while path and Path(path).exists() and time.monotonic() < deadline:
            time.sleep(0.2)
