"""A callback that writes down what each training step was fed, so tests can compare two runs' data.

    --trainer.callbacks+=tests.batch_recorder.RecordBatches    (with $ARCH_LAB_RECORD_BATCHES set to a folder)

One JSON line per step: the run's seed, its norm strategy, the step and a checksum of the input batch.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import lightning as L
import torch


class RecordBatches(L.Callback):
    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        inputs = batch[0]
        # Positions weighted by index: a permutation of the same tokens does not give the same checksum.
        weights = torch.arange(1, inputs.numel() + 1, dtype=torch.float64)
        arch = pl_module.hparams.arch  # a TransformerConfig, or its dict once it went through a checkpoint
        line = {"seed": os.environ.get("PL_GLOBAL_SEED"), "norm": arch["norm"] if isinstance(arch, dict) else arch.norm,
                "lr": pl_module.hparams.lr, "step": trainer.global_step,
                "checksum": float((inputs.flatten().double() * weights).sum())}
        folder = Path(os.environ["ARCH_LAB_RECORD_BATCHES"])
        with open(folder / f"{os.getpid()}.jsonl", "a") as f:
            f.write(json.dumps(line) + "\n")
