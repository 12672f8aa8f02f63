"""Tells modules that declared a progress hook where training stands (``arch_plugins/progress.py``).

Generic: it calls whatever ``progress_hooks`` finds (PRepBN's LayerNorm-to-BatchNorm schedule, BHyT's
refresh of its variance approximation, the LayerNorm-removal schedule), never plugin names. When: at the
first micro-batch of each optimizer step, before its forward pass, with ``trainer.global_step`` (steps
already taken). With gradient accumulation the later micro-batches of a step do not call again; after a
resume the first call is at the step the run resumes from. The run's length is
``trainer.estimated_stepping_batches`` (None when Lightning cannot know it). Modules declare their hooks when
they are built, so the hooks are collected once, at the start of training, not by walking the model every step.
"""

from __future__ import annotations

import math
from typing import Any

import lightning as L

from arch_plugins.progress import TrainingProgress, progress_hooks, run_hooks


class ReportTrainingProgress(L.Callback):
    def __init__(self) -> None:
        self._last_step: int | None = None
        self._total: int | None = None
        self._hooks: list = []
        # Optimizer steps reported in this fit (tests read it).
        self.steps_reported = 0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        total = trainer.estimated_stepping_batches
        self._total = int(total) if isinstance(total, (int, float)) and math.isfinite(total) else None
        self._last_step, self.steps_reported = None, 0
        self._hooks = list(progress_hooks(pl_module))

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if trainer.global_step == self._last_step:
            return  # a later micro-batch of the same optimizer step
        self._last_step = trainer.global_step
        run_hooks(self._hooks, TrainingProgress(trainer.global_step, self._total))
        self.steps_reported += 1
