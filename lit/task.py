"""What every task's LightningModule shares: the optimizer, the constraints, how blocks run, the checkpoint extras.

Subclasses (LanguageModel, ImageClassifier) build ``self.model`` and save ``lr``, ``weight_decay``,
``betas``, ``warmup_steps`` and ``min_lr_ratio`` as hyperparameters; they own loss and metrics only.
How the blocks execute (``compile``, ``activation_checkpointing``) and what diagnostics record (``diagnostics``)
are passed to this base and are not hyperparameters: a resumed run takes them from its own command line
(LightningCLI restores a checkpoint's hyperparameters over the command line's), so a run can resume under
another overlay, or with diagnostics turned off or made denser around a problem.
"""

from __future__ import annotations

import lightning as L
import torch

from arch_plugins.declarations import has_progress_hooks
from lit.callbacks import (
    LogRoleTable,
    RenormalizeUnitNormWeights,
    ReportTrainingProgress,
    StopOnNonFiniteLoss,
    has_unit_norm_weights,
)
from lit.checkpoints import restore_rng_states, rng_states
from lit.compute import non_embedding_parameters
from lit.diagnostics import Diagnostics, DiagnosticsConfig
from lit.optim import adamw_warmup_cosine
from lit.parallel import checkpoint_blocks, compile_blocks, shard
from lit.throughput import StepRate

EXECUTION_OPTIONS = ("compile", "activation_checkpointing", "diagnostics")


class ArchitectureTask(L.LightningModule):
    """Args:
        compile: ``torch.compile`` each transformer block.
        activation_checkpointing: recompute each block's activations in backward.
        items: what training throughput counts (``tokens``, ``images``): logged as ``train/<items>_per_s``.
        diagnostics: what the diagnostics callback records and how often (``lit/diagnostics``).
    """

    def __init__(self, compile: bool = False, activation_checkpointing: bool = False, items: str = "samples",
                 diagnostics: DiagnosticsConfig | None = None):
        super().__init__()
        self.compile_each_block, self.recompute_activations = compile, activation_checkpointing
        self.diagnostics = diagnostics if diagnostics is not None else DiagnosticsConfig()
        self.throughput, self.throughput_metric = StepRate(), f"train/{items}_per_s"
        self.flops_metric = f"model/flops_per_{items.removesuffix('s')}"
        self.flops_per_item: float | None = None
        self._size_logged = False

    def training_flops_per_item(self) -> float | None:
        """Training FLOPs per item (token, image) of ``self.model`` as built; None where the task cannot count."""
        return None

    def setup(self, stage: str) -> None:
        # Counted on the model as built, before compile or sharding wrap it (lit/compute.py).
        if stage == "fit" and self.flops_per_item is None:
            self.flops_per_item = self.training_flops_per_item()

    def log_training_step(self, loss: torch.Tensor, items: int) -> None:
        """The metrics every task logs per training step: loss, learning rate, items/s over all processes.

        Once per fit it also logs the run's size facts that comparisons need (``cli.py compare`` turns
        steps into tokens and reports parameters): ``model/parameters``, ``model/non_embedding_parameters``,
        ``train/items_per_step`` and ``model/flops_per_token`` (or ``_per_image``); and at every step
        ``train/flops``, the training FLOPs spent so far, so curves can be drawn against compute.
        """
        per_step = items * self.trainer.world_size * self.trainer.accumulate_grad_batches
        if not self._size_logged:
            self._size_logged = True
            # numel of an FSDP2 DTensor is the global count, so this is the whole model on any strategy.
            facts = {"model/parameters": float(sum(p.numel() for p in self.parameters())),
                     "model/non_embedding_parameters": float(non_embedding_parameters(self.model)),
                     "train/items_per_step": float(per_step)}
            if self.flops_per_item is not None:
                facts[self.flops_metric] = self.flops_per_item
            for logger in self.loggers:
                logger.log_metrics(facts, step=self.global_step)
        if self.flops_per_item is not None:
            # global_step counts the optimizer steps already taken: this batch belongs to the (global_step + 1)th.
            self.log("train/flops", self.flops_per_item * per_step * (self.global_step + 1))
        self.log("train/loss", loss, prog_bar=True)
        self.log("train/lr", self.optimizers().param_groups[0]["lr"])
        rate = self.throughput.tick(items * self.trainer.world_size)
        if rate is not None:
            self.log(self.throughput_metric, rate, prog_bar=True)

    def on_train_epoch_start(self) -> None:
        self.throughput.reset()  # time spent outside training steps is not training throughput

    def on_validation_start(self) -> None:
        self.throughput.reset()

    def configure_model(self) -> None:
        # torchtitan's order: activation checkpointing, then compile, then FSDP2 (strategies with a device mesh).
        if self.recompute_activations:
            checkpoint_blocks(self.model)
        if self.compile_each_block:
            compile_blocks(self.model)
        if self.device_mesh is not None:
            shard(self.model, self.device_mesh, self.trainer.precision if self._trainer else None)

    def configure_callbacks(self) -> list[L.Callback]:
        # Whatever the architecture, weights that declared a unit-norm constraint are kept on the sphere;
        # attached here so that selecting such a plugin on the command line cannot forget the callback.
        # A diverged run stops before it overwrites the last good checkpoint.
        # The role table is logged once per fit (what each parameter is decides its optimizer group and decay).
        callbacks: list[L.Callback] = [StopOnNonFiniteLoss(), LogRoleTable()]
        if has_unit_norm_weights(self.model):
            callbacks.append(RenormalizeUnitNormWeights())
        # Likewise for modules that follow the step count (PRepBN's schedule, BHyT's refresh).
        if has_progress_hooks(self.model):
            callbacks.append(ReportTrainingProgress())
        # On by default, as cheap as its interval makes it; off (interval 0) attaches nothing at all.
        if self.diagnostics.enabled:
            callbacks.append(Diagnostics(self.diagnostics))
        return callbacks

    def configure_optimizers(self):
        hp = self.hparams
        return adamw_warmup_cosine(self, hp.lr, hp.weight_decay, hp.betas, hp.warmup_steps, hp.min_lr_ratio)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        # Lightning does not keep random states; dropout, drop-path and batch mixing resume exactly with them.
        checkpoint["rng_states"] = rng_states()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if "rng_states" in checkpoint:
            restore_rng_states(checkpoint["rng_states"])
