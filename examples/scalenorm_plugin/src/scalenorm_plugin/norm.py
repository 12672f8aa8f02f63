"""ScaleNorm (Nguyen & Salazar 2019, "Transformers without Tears"), as a pre-norm strategy.

``y = g * x / max(||x||_2, eps)`` over the last dimension, with one learnable scalar ``g`` per norm
layer, initialised to ``sqrt(d)`` as in the paper (so that, like RMSNorm, the output has unit RMS at
initialisation). Pure PyTorch: nothing here knows about Lightning.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from arch_plugins.declarations import declare_diagnostic, declare_role
from arch_plugins.init_identity import InitIdentity
from arch_plugins.interfaces import Role
from arch_plugins.norms.prenorm import PreNorm


class ScaleNorm(nn.Module):
    """``g * x / max(||x||_2, eps)`` over the last dimension, with a single scalar gain ``g``."""

    def __init__(self, dim: int, eps: float = 1e-5, learnable: bool = True):
        super().__init__()
        self.dim, self.eps = dim, eps
        g = torch.tensor(math.sqrt(dim))
        if learnable:
            self.g = nn.Parameter(g)
            # What g is, for arch-lab's optimizers and role table (docs/plugins/declarations.md in arch-lab).
            declare_role(self, "g", Role.SCALAR)
            # arch-lab's diagnostics callback logs it as diag/scalar/<module path>.g; it names no plugin.
            declare_diagnostic(self, "g")
        else:
            self.register_buffer("g", g)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The norm is taken in float32 so that bf16/fp16 activations do not overflow the sum of squares.
        norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=torch.float32).clamp_min(self.eps)
        return (x.float() * (self.g.float() / norm)).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}, learnable={isinstance(self.g, nn.Parameter)}"


class ScaleNormStrategy(PreNorm):
    """Pre-norm with ScaleNorm (L2-normalise, then one learnable scalar gain g = sqrt(d) at init)."""

    # g = sqrt(d) makes sqrt(d) x / ||x|| = x / rms(x): RMSNorm without a gain (and without its eps, which ScaleNorm
    # puts on the norm instead). arch-lab's conformance kit checks it, up to rounding.
    init_identities = (InitIdentity("rmsnorm", same_as_options={"affine": False, "eps": 0.0}, exact=False),)

    def __init__(self, eps: float = 1e-5, learnable: bool = True):
        if eps <= 0:
            raise ValueError(f"eps must be positive, got {eps}")
        if not isinstance(learnable, bool):
            raise ValueError(f"learnable must be true or false, got {learnable!r}")
        self.eps, self.learnable = eps, learnable

    def make_norm(self, dim: int) -> nn.Module:
        return ScaleNorm(dim, eps=self.eps, learnable=self.learnable)
