"""Trains tests/distributed_worker.py's tiny nGPT with diagnostics at every step and saves what rank 0 logged.

Run as a script by tests/test_diagnostics.py under one process and under FSDP2 on 2 gloo processes: every rank
sees the same batches, so the sharded run computes the single-process gradients and must log the same global
norms, probe statistics and (gathered) scalars.

    python tests/diagnostics_worker.py --strategy fsdp2 --out metrics.pt
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.loggers.logger import Logger

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere, as pytest's subprocess does

from lit.diagnostics import DiagnosticsConfig  # noqa: E402
from lit.language_model import LanguageModel  # noqa: E402
from lit.models import TransformerConfig  # noqa: E402
from tests.distributed_worker import ACCUMULATE, STEPS, VOCAB, T, batches  # noqa: E402


class RecordingLogger(Logger):
    """Keeps every logged metric: {name: {step: value}}."""

    def __init__(self):
        super().__init__()
        self.metrics: dict[str, dict[int, float]] = {}

    @property
    def name(self) -> str:
        return "recording"

    @property
    def version(self) -> str:
        return "0"

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        for name, value in metrics.items():
            self.metrics.setdefault(name, {})[step] = float(value)


def build_model(**diagnostics) -> LanguageModel:
    torch.manual_seed(0)
    arch = TransformerConfig(d_model=32, n_layers=2, n_heads=2, norm="hypersphere", residual="ngpt", init_std=0.2)
    return LanguageModel(vocab_size=VOCAB, block_size=T, arch=arch, lr=2e-2, weight_decay=0.0, warmup_steps=0,
                         diagnostics=DiagnosticsConfig(interval=1, probe_batch_size=3, **diagnostics))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--strategy", choices=["single", "fsdp2"], required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if args.strategy == "fsdp2":
        from lightning.pytorch.strategies import ModelParallelStrategy

        strategy, devices = ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1), 2
    else:
        strategy, devices = "auto", 1
    logger = RecordingLogger()
    trainer = L.Trainer(accelerator="cpu", devices=devices, strategy=strategy, max_steps=STEPS,
                        accumulate_grad_batches=ACCUMULATE, use_distributed_sampler=False, logger=logger,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        limit_val_batches=0, num_sanity_val_steps=0)
    model = build_model()
    trainer.fit(model, batches())
    if trainer.global_rank == 0:
        diag = {name: values for name, values in logger.metrics.items() if name.startswith("diag/")}
        torch.save({"metrics": diag, "world_size": trainer.world_size}, args.out)


if __name__ == "__main__":
    main()
