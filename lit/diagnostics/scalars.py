"""The learned scalars that modules declared (``arch_plugins.diagnostics``), read without naming any plugin."""

from __future__ import annotations

import torch
from torch import nn

from arch_plugins.constraints import is_dtensor
from arch_plugins.diagnostics import declared_diagnostics


@torch.no_grad()
def scalar_values(model: nn.Module) -> dict[str, torch.Tensor]:
    """``{diag/scalar/<module path>.<name>: 0-d fp32 tensor}``; a value with several elements is its mean.

    Under FSDP2 a declared parameter is a DTensor shard and so is what the declaring function computes from
    it: it is gathered whole (``full_tensor``, collective: every rank calls this, in the same module order)
    before the mean, so uneven or empty shards cannot bias it. These are small vectors (at most d_model).
    """
    values = {}
    for path, module, fn in declared_diagnostics(model):
        value = fn(module)
        if is_dtensor(value):
            value = value.full_tensor()
        values[f"diag/scalar/{path}"] = value.detach().float().mean()
    return values
