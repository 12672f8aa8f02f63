"""A model's tensors on the meta device (shapes and dtypes, no storage), for a copy whose forward computes nothing.

``copy.deepcopy(model, meta_memo(model))`` is that copy: the FLOP count runs its forward (``lit.compute``) and the
conformance kit's ``meta`` check holds every plugin to running there.
"""

from __future__ import annotations

import torch
from torch import nn


def meta_memo(model: nn.Module) -> dict[int, torch.Tensor]:
    """A deepcopy memo mapping each parameter and buffer of ``model`` to its meta twin (a parameter stays one)."""
    memo = {}
    for t in (*model.parameters(), *model.buffers()):
        meta = torch.empty_like(t, device="meta")
        memo[id(t)] = nn.Parameter(meta, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else meta
    return memo
