"""LayerNorm-free: each LayerNorm replaced by the fixed linear map it becomes after removal (Baroni et al. 2025).

"Transformers Don't Need LayerNorm at Inference Time" (arXiv 2507.02559; code submarat/removing-layer-norm)
fine-tunes a pre-LayerNorm GPT-2 while each LayerNorm's division by the token's standard deviation is
replaced by a division by a frozen scalar, one norm after another. What is left is
``(x - mean(x)) / sigma * w + b``: mean-centring (linear) and a fixed per-channel affine map, with no
statistic of the token's scale. This strategy is that architecture, with ``w / sigma`` stored as one gain:
``cli.py remove-norms`` writes its checkpoints. The reference exports the same map inside unmodified
LayerNorms (eps 1e12, gain times 1e6 / sigma); here it is a module of its own that a checkpoint names.
"""

from __future__ import annotations

import torch
from torch import nn

from arch_plugins.declarations import declare_roles
from arch_plugins.interfaces import NormStrategy, Role, Site, StackInfo

SITES = (Site.ATTN_IN, Site.MLP_IN, Site.FINAL)


class CentredAffine(nn.Module):
    """``(x - mean(x)) * weight + bias``: a LayerNorm whose division by the token's std was removed."""

    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))
        declare_roles(self, {"weight": Role.GAIN, "bias": Role.BIAS})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - x.mean(dim=-1, keepdim=True)) * self.weight + self.bias

    def inference_affine(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(A, b) with output ``x @ A.T + b``: centring then the gain, as one (d, d) matrix."""
        d = self.weight.shape[0]
        centring = torch.eye(d, device=self.weight.device) - 1.0 / d
        return self.weight[:, None] * centring, self.bias


class LNFreeStrategy(NormStrategy):
    """LayerNorm-free (Baroni et al. 2025): every pre-norm is mean-centring and a fixed gain and bias, no statistic.

    Produced from a pre-LayerNorm checkpoint by ``cli.py remove-norms``; trainable as it is (a model with no
    normalisation of scale anywhere).
    """

    def site(self, site: str, dim: int, layer: int | None, stack: StackInfo) -> nn.Module | None:
        return CentredAffine(dim) if site in SITES else None
