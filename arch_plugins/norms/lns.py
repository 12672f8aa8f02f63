"""LayerNorm-Scaling (Sun et al., "The Curse of Depth in LLMs", NeurIPS 2025)."""

from __future__ import annotations

import math

import torch
from torch import nn

from arch_plugins.interfaces import NormStrategy, Site, StackInfo
from arch_plugins.norms.prenorm import base_norm


class ScaledNorm(nn.Module):
    """A norm layer whose output is multiplied by a fixed factor (after its affine, as in the paper's code)."""

    def __init__(self, norm: nn.Module, scale: float):
        super().__init__()
        self.norm, self.scale = norm, scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x) * self.scale

    def extra_repr(self) -> str:
        return f"scale={self.scale:.6g}"


class LayerNormScalingStrategy(NormStrategy):
    """LayerNorm-Scaling: pre-norm whose output in block l (0-based) is scaled by 1/sqrt(l+1); final norm unscaled.

    Damps the deep layers' contribution, whose pre-norm output variance otherwise grows with depth
    until they act almost as identities (the "curse of depth"). No new parameters. The authors
    advise plain normal init, not depth-scaled init, with it (``depth_scaled_init: false``).

    Args:
        base: the norm layer, ``rmsnorm`` or ``layernorm``.
        eps: that layer's epsilon (None: its own default).
    """

    def __init__(self, base: str = "rmsnorm", eps: float | None = None):
        self.base = base_norm(base, eps)

    def site(self, site: str, dim: int, layer: int | None, stack: StackInfo) -> nn.Module | None:
        if site in (Site.ATTN_IN, Site.MLP_IN):
            return ScaledNorm(self.base.make_norm(dim), 1.0 / math.sqrt(layer + 1))
        if site == Site.FINAL:
            return self.base.make_norm(dim)
        return None
