"""Single-scale RMSNorm (SSNorm) and the learnable embedding projection (EmbProj) of Outlier-Safe Pre-Training (Park et
al.; "Outlier-Safe Pre-Training for Robust 4-Bit Quantization of Large Language Models", ACL 2025; code
dmis-lab/Outlier-Safe-Pre-Training).

SSNorm is RMSNorm with one learned scalar gain for the whole vector instead of one per channel: a per-channel gain
lets training grow a few channels into the outliers that wreck 4-bit quantization, a single scale cannot single a
channel out. The reference (``example_modeling_flax.py``, commit 4c2c367) builds every norm as flax's
``nn.RMSNorm(feature_axes=())`` when ``rmsnorm_scale="single"`` (``:44``, ``:60-61``, ``:91-92``, ``:104``): a scalar
``scale`` initialised to 1, epsilon 1e-6 (flax's default), ``x * rsqrt(mean(x^2) + eps) * scale``.

EmbProj (``rotated_embed=True``, ``:45``, ``:107-116``): a learned d x d dense layer (with bias, flax's default) right
after the token embedding and another between the final norm and the head, both initialised orthogonal. They give
the embedding and the head a basis of their own, so the stream's basis is free to stay outlier-free. Here they are
the embedding site and a projection after the final norm at the final site, so the block and the model need
nothing new.

The paper trains OSP with Muon (and its embeddings and these projections with Adam); the optimizer is the run's
choice, not this strategy's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from arch_plugins.declarations import declare_diagnostic, declare_norm_output, declare_role, declare_roles
from arch_plugins.interfaces import Kind, NormStrategy, Role, Site, StackInfo

SITES = (Site.ATTN_IN, Site.MLP_IN, Site.FINAL)


class SingleScaleRMSNorm(nn.Module):
    """``x * rsqrt(mean(x^2) + eps) * scale`` with ``scale`` one learned scalar (flax RMSNorm, feature_axes=())."""

    def __init__(self, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.scale = nn.Parameter(torch.ones(()))
        declare_role(self, "scale", "single_scale_gain", kind=Kind.SCALAR, group="norms")
        declare_diagnostic(self, "scale")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The fused native RMSNorm (one kernel each way on CUDA) with the scalar broadcast to a gain vector: the same
        # x * rsqrt(mean(x^2) + eps) * scale, and autograd sums the expanded gain's gradient back into the scalar.
        d = x.shape[-1]
        return F.rms_norm(x.float(), (d,), self.scale.expand(d), self.eps).to(x.dtype)

    def extra_repr(self) -> str:
        return f"eps={self.eps:g}"


def orthogonal_projection(dim: int) -> nn.Linear:
    """EmbProj's d x d dense layer: orthogonal weight, zero bias (flax DenseGeneral with ``init.orthogonal()``)."""
    linear = nn.Linear(dim, dim, bias=True)
    nn.init.orthogonal_(linear.weight)
    nn.init.zeros_(linear.bias)
    declare_roles(linear, {"weight": "embedding_projection"}, kind=Kind.HIDDEN)
    declare_roles(linear, {"bias": Role.BIAS})
    return linear


class SingleScaleRMSNormStrategy(NormStrategy):
    """Pre-norm with single-scale RMSNorm at every norm (the blocks' two and the final), OSP's SSNorm.

    Args:
        eps: the norm's epsilon (flax RMSNorm's default 1e-6, which the reference keeps).
        embedding_projection: OSP's EmbProj, an orthogonally initialised d x d projection after the embedding and
            another between the final norm and the head (the reference's ``rotated_embed``; off by default there).
    """

    def __init__(self, eps: float = 1e-6, embedding_projection: bool = False):
        if not eps > 0:
            raise ValueError(f"eps must be positive, got {eps!r}")
        self.eps, self.embedding_projection = eps, bool(embedding_projection)

    def site(self, site: str, dim: int, layer: int | None, stack: StackInfo) -> nn.Module | None:
        if site == Site.EMBEDDING and self.embedding_projection:
            return orthogonal_projection(dim)
        if site not in SITES:
            return None
        if site == Site.FINAL and self.embedding_projection:
            # The probes read the final state at the norm, before the projection: in the reference's released
            # checkpoints the projection is folded into the head, and its kurtosis reads the last hidden state.
            norm = SingleScaleRMSNorm(self.eps)
            declare_norm_output(norm)
            return nn.Sequential(norm, orthogonal_projection(dim))
        return SingleScaleRMSNorm(self.eps)
