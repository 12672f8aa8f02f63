"""Clipped softmax (Bondarenko, Nagel, Blankevoort; "Quantizable Transformers: Removing Outliers by Helping Attention
Heads Do Nothing", NeurIPS 2023; code qualcomm-ai-research/outlier-free-transformers).

``clip((zeta - gamma) * softmax(x) + gamma, 0, 1)`` (``transformers_language/models/softmax.py:8-11``, the
reference's ``eta`` is ``zeta`` here). With gamma < 0 a head can give a key exactly zero weight from finite logits,
so it no longer needs ever larger logits (and the outliers that feed them) to attend to nothing; zeta > 1 lets a
weight reach exactly one. gamma = 0, zeta = 1 is the softmax exactly.

The reference's OPT runs set gamma from ``alpha`` and the sequence length, ``gamma = -alpha / T`` with eta = 1
(``transformers_language/models/opt_attention.py:67-72``; ``scripts/opt_125m_clipped_softmax.sh``: alpha 12 at
T = block size 512, so gamma = -0.0234). This module takes gamma and zeta as numbers; a recipe writes the T it
trains at into gamma.
Computed in float32, as the reference upcasts fp16 logits before its softmax (the ``softmax_fn`` call in
``OPTAttentionWithExtras.forward``).
"""

from __future__ import annotations

import torch
from torch import nn


class ClippedSoftmax(nn.Module):
    """clip((zeta - gamma) * softmax(x, -1) + gamma, 0, 1)."""

    def __init__(self, gamma: float, zeta: float):
        super().__init__()
        for name, value in (("gamma", gamma), ("zeta", zeta)):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"clipped_softmax_{name} must be a number, got {value!r}")
        if not gamma <= 0 or not zeta >= 1:
            raise ValueError(f"clipped softmax stretches the softmax's range [0, 1] to [gamma, zeta] and clips it: "
                             f"give gamma <= 0 and zeta >= 1 (the paper: gamma = -alpha / T, zeta = 1), got "
                             f"gamma={gamma!r}, zeta={zeta!r}")
        self.gamma, self.zeta = float(gamma), float(zeta)

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        stretched = torch.softmax(scores.float(), dim=-1) * (self.zeta - self.gamma) + self.gamma
        return stretched.clamp(0.0, 1.0)

    def extra_repr(self) -> str:
        return f"gamma={self.gamma:g}, zeta={self.zeta:g}"
