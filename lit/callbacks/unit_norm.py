"""Keeps every weight that declared a unit-norm constraint on the unit sphere during training.

Generic: it renormalises whatever ``arch_plugins.constraints.unit_norm_parameters`` finds (nGPT's
hypersphere strategy is one user), never parameter names. When:

- at ``on_train_start``: before the first step, and on resume (Lightning restores checkpoints before
  this hook, also under FSDP2 where restoring happens after the strategy's setup);
- after every optimizer step, through ``Optimizer.register_step_post_hook``: exactly once per step,
  whatever the gradient accumulation (Lightning runs the closure inside ``optimizer.step``, so the hook
  fires after the update), and not at all when an AMP scaler skips the step. ``on_before_zero_grad``
  would run between forward and backward in Lightning's closure and
  ``on_train_batch_end`` runs on every micro-batch.

Under DDP every rank renormalises its identical replica locally; under FSDP2 the DTensor shards are
renormalised in place with a reduction along a sharded dim, no full weight is gathered.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.strategies import FSDPStrategy

from arch_plugins.constraints import renormalize_, unit_norm_parameters
from lit.errors import UserInputError


def has_unit_norm_weights(module: torch.nn.Module) -> bool:
    return next(unit_norm_parameters(module), None) is not None


class RenormalizeUnitNormWeights(L.Callback):
    """Renormalises declared unit-norm weights before training, on resume, and after each optimizer step."""

    def __init__(self) -> None:
        self._handles: list[Any] = []
        self._module: torch.nn.Module | None = None
        # Optimizer steps renormalised in this fit (the test of "exactly once per step" reads it).
        self.steps_renormalized = 0

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if isinstance(trainer.strategy, FSDPStrategy):
            # FSDP1 flattens parameters into per-rank slices that cut rows apart: a norm along any axis
            # would be computed on fragments. FSDP2 keeps whole rows per shard (DTensor Shard(0)).
            raise UserInputError("unit-norm weights cannot be renormalised under FSDPStrategy (FSDP1 flat "
                                 "parameters); use --trainer.strategy=ModelParallelStrategy (FSDP2) or ddp")

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._remove_hooks()
        self._module, self.steps_renormalized = pl_module, 0
        renormalize_(pl_module)
        for optimizer in trainer.optimizers:
            self._handles.append(optimizer.register_step_post_hook(self._after_step))

    def _after_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        renormalize_(self._module)
        self.steps_renormalized += 1

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._remove_hooks()

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._remove_hooks()  # also after an exception, so a reused optimizer does not keep the hook

    def _remove_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
