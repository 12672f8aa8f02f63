"""The optimizer and learning-rate schedule of every task: ``--model.optimizer`` stepped by ``--model.schedule``.

The optimizer is a plugin (entry-point group ``arch_plugins.optimizer``: ``adamw``, ``muon``; ``python cli.py
plugins``) that routes parameters by their declared roles; the schedule is ``lit/schedules.py``'s.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from arch_plugins import registry
from arch_plugins.optimizers.adamw import AdamWOptimizer
from lit.schedules import multiplier, warmup_cosine

__all__ = ["adamw", "warmup_cosine", "adamw_warmup_cosine", "select_optimizer", "configure",
           "with_installed_optimizers"]


def adamw(model: nn.Module, lr: float, weight_decay: float, betas: tuple[float, float]) -> torch.optim.AdamW:
    """Matrices (and embeddings) decay; vectors (norm gains, biases, learnable scales) do not, unless the module
    that owns a parameter declares otherwise: decay follows each parameter's role
    (``arch_plugins.declarations.decays``), and ``declare_weight_decay`` overrides it. A parametrization's declared
    optimizer scales (``optimizer_scales``) multiply each parameter's lr, weight decay and epsilon."""
    return AdamWOptimizer().build(model, lr=lr, weight_decay=weight_decay, betas=tuple(betas))


def with_installed_optimizers(doc: str) -> str:
    """``doc`` with ``<optimizers>`` naming the optimizers installed now (`--help` lists them; metadata only)."""
    return doc.replace("<optimizers>", f"optimizers ({', '.join(registry.names('optimizer'))})")


def select_optimizer(name: str, options: dict[str, Any] | None):
    """The optimizer plugin ``name`` with ``options`` (a one-line ``PluginError`` for a bad name or option)."""
    return registry.create("optimizer", name, options)


def configure(module, *, optimizer: str = "adamw", optimizer_options: dict[str, Any] | None = None, lr: float,
              weight_decay: float, betas: tuple[float, float], warmup_steps: int, min_lr_ratio: float,
              schedule: str = "cosine", schedule_options: dict[str, Any] | None = None,
              total_steps: int | None = None) -> dict:
    """``configure_optimizers`` of every LightningModule here: the optimizer plugin's optimizer, stepped per step
    by the schedule over ``total_steps`` (default: Lightning's ``estimated_stepping_batches``)."""
    built = select_optimizer(optimizer, optimizer_options).build(module, lr=lr, weight_decay=weight_decay,
                                                                  betas=tuple(betas))
    total = int(module.trainer.estimated_stepping_batches) if total_steps is None else total_steps
    factor = multiplier(schedule, schedule_options, warmup_steps=warmup_steps, total_steps=total,
                        min_lr_ratio=min_lr_ratio)
    scheduler = torch.optim.lr_scheduler.LambdaLR(built, factor)
    return {"optimizer": built, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def adamw_warmup_cosine(module, lr: float, weight_decay: float, betas: tuple[float, float], warmup_steps: int,
                        min_lr_ratio: float) -> dict:
    """AdamW stepped by a per-step warmup-cosine (``configure``'s defaults)."""
    return configure(module, lr=lr, weight_decay=weight_decay, betas=betas, warmup_steps=warmup_steps,
                     min_lr_ratio=min_lr_ratio)
