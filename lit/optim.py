"""AdamW with decay / no-decay groups and a linear-warmup + cosine schedule (nanoGPT's recipe)."""

from __future__ import annotations

import math
from functools import partial

import torch
from torch import nn

from arch_plugins.declarations import decays


def adamw(model: nn.Module, lr: float, weight_decay: float, betas: tuple[float, float]) -> torch.optim.AdamW:
    """Matrices (and embeddings) decay; vectors (norm gains, biases, learnable scales) do not, unless the module
    that owns a parameter declares otherwise: decay follows each parameter's role
    (``arch_plugins.declarations.decays``), and ``declare_weight_decay`` overrides it."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = decays(model)
    groups = [
        {"params": [p for p in params if decay[id(p)]], "weight_decay": weight_decay},
        {"params": [p for p in params if not decay[id(p)]], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, betas=betas)


def warmup_cosine(step: int, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    """LR multiplier: linear warmup to 1, then cosine decay to ``min_lr_ratio`` at ``total_steps``."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def adamw_warmup_cosine(module, lr: float, weight_decay: float, betas: tuple[float, float], warmup_steps: int,
                        min_lr_ratio: float) -> dict:
    """``configure_optimizers`` of every LightningModule here: AdamW stepped by a per-step warmup-cosine."""
    optimizer = adamw(module, lr, weight_decay, tuple(betas))
    total = int(module.trainer.estimated_stepping_batches)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, partial(warmup_cosine, warmup_steps=warmup_steps, total_steps=total, min_lr_ratio=min_lr_ratio))
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
