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
Computed in the scores' dtype, the compute dtype (bf16 under autocast; the block's explicit attention no longer
upcasts its (B, H, T, S) scores), with the softmax's sums accumulated in fp32 inside its kernel: the review's interim
change (``../shared/specs/gpu-plugins.md`` §2.6), which halves the T² bytes, and which ``--model.compile`` fuses
into one pass. The reference upcasts fp16 logits before its softmax (the ``softmax_fn`` call in
``OPTAttentionWithExtras.forward``); bf16 has fp32's range, so only the rounding of the weights differs (to bf16's,
as the old path's cast of the weights to bf16 before ``@ v`` already did). In fp32 nothing changed.

Not on a fused attention kernel. The exact two-pass flash form (§2.6: pass 1 an ordinary FlexAttention forward
returning the log-normaliser L, pass 2 FlexAttention with ``score_mod`` s -> log clamp((zeta - gamma) exp(s - L) +
gamma, 0, 1), then o = exp(L_2) out_2, o = 0 where every weight clips) computes the clipped attention's forward on
torch 2.14.1's CPU FlexAttention to 5e-7 in fp32, dead rows included (L_2 = -inf, out_2 = 0). But that FlexAttention
refuses any input that requires a gradient on a CPU ("FlexAttention does not support backward on CPU", its
``_validate_device``), so neither the training path nor its gradient through the captured L (pytorch#133159,
#137452) can be run or tested without a GPU; the form is left for a session with a GPU lent, with the materialised
path below kept as its reference.
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
        # dtype=scores.dtype: the softmax accumulates in fp32 inside its kernel and writes the scores' dtype. Without
        # it CUDA's autocast would run the softmax in fp32 (it is on autocast's fp32 list) and every (B, H, T, S)
        # tensor after it, and what backward keeps of them, would be fp32 again.
        stretched = torch.softmax(scores, dim=-1, dtype=scores.dtype) * (self.zeta - self.gamma) + self.gamma
        return stretched.clamp(0.0, 1.0)

    def extra_repr(self) -> str:
        return f"gamma={self.gamma:g}, zeta={self.zeta:g}"
