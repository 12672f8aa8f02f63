"""z-loss (PaLM, Chowdhery et al. 2022): an auxiliary loss that keeps the softmax normaliser log Z near 0.

    z_loss = coefficient * mean over tokens of (log sum_v exp(logit_v))^2

PaLM uses coefficient 1e-4 "to increase the stability of training"; without it, log Z can drift, and the logits
with it, since cross-entropy is invariant to a shift of all logits.
"""

from __future__ import annotations

import torch


def z_loss(logits: torch.Tensor) -> torch.Tensor:
    """mean(logsumexp(logits, -1)^2) in float32, over every position; multiply by the coefficient."""
    return torch.logsumexp(logits.float(), dim=-1).square().mean()
