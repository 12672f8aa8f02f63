"""SeeDNorm, Self-Rescaled Dynamic Normalization (Cai, Zhu, Liu, Min; ICLR 2026)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from arch_plugins.autocast import autocast_off
from arch_plugins.declarations import declare_diagnostic, declare_role, declare_roles
from arch_plugins.init_identity import InitIdentity
from arch_plugins.interfaces import Kind, NormStrategy, Role, Site, StackInfo
from arch_plugins.registry import PluginError

# Heads of the multi-head form for encoders: the paper's best for ViT-B (1 head diverged; 8, 16, 32
# gave 82.5, 82.7, 82.5).
ENCODER_HEADS = 16


class SeeDNorm(nn.Module):
    """RMSNorm whose gain depends on the input: [tanh(<x_h, beta_h> * s) alpha_h + gamma] * x / RMS(x).

    ``<x_h, beta_h>`` is one scalar per token and head (the raw input's channels of that head dotted
    with beta's), so the gain rescales with the input it normalises. beta starts at zero: the layer
    is exactly RMSNorm (gain gamma) at init.
    """

    def __init__(self, dim: int, heads: int = 1, alpha_init: float = 1.0, eps: float = 1e-6,
                 mean_dot: bool = False, dropout: float = 0.0):
        super().__init__()
        self.heads, self.eps = heads, eps
        self.weight = nn.Parameter(torch.ones(dim))  # gamma: RMSNorm's gain, under RMSNorm's name
        self.alpha = nn.Parameter(torch.full((dim,), float(alpha_init)))
        self.beta = nn.Parameter(torch.zeros(dim))
        declare_role(self, "weight", Role.GAIN)
        # alpha scales the input-dependent part of the gain; beta is the direction it is read along: both width-sized.
        declare_roles(self, {"alpha": "seednorm_alpha", "beta": "seednorm_beta"}, kind=Kind.VECTOR, group="norms")
        self.dot_scale = 1.0 / (dim // heads) if mean_dot else 1.0
        self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        # beta is a direction (zero at init, signs cancel in a mean): its L2 norm says how far the gain has
        # become input-dependent; alpha's mean says how strongly.
        declare_diagnostic(self, "alpha")
        declare_diagnostic(self, "beta_norm", _beta_norm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d, h = x.shape[-1], self.heads
        if h == 1:
            # One head: <x, beta> is a matrix-vector product, no (..., d) temporary. Outside autocast, which would
            # run it in bf16; in the dtype x * beta promotes to, as the elementwise form computed it. (A device
            # without autocast, such as meta, has nothing to turn off.)
            # promote_types of the dtypes, not result_type of the tensors: the same dtype for these two (neither is a
            # 0-dim tensor), and torch.compile traces it (result_type broke the graph).
            with autocast_off(x.device.type):
                per_head = x.to(torch.promote_types(x.dtype, self.beta.dtype)) @ self.beta.unsqueeze(-1)
        else:
            per_head = (x.unflatten(-1, (h, d // h)) * self.beta.view(h, -1)).sum(-1)
        gate = torch.tanh(per_head * self.dot_scale if self.dot_scale != 1.0 else per_head)  # bounded: see above
        if isinstance(self.drop, nn.Identity) or not self.training:
            # gamma + gate * alpha in one pass (addcmul) instead of a multiply and an add over (..., d).
            gain = torch.addcmul(self.weight.view(h, -1), gate.unsqueeze(-1), self.alpha.view(h, -1)).flatten(-2)
        else:  # dropout acts on the dynamic term alone, so it is materialised first
            gain = self.drop((gate.unsqueeze(-1) * self.alpha.view(h, -1)).flatten(-2)) + self.weight
        return F.rms_norm(x, (d,), eps=self.eps) * gain

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, heads={self.heads}, eps={self.eps}"


def _beta_norm(norm: SeeDNorm) -> torch.Tensor:
    return torch.linalg.vector_norm(norm.beta.float())


class SeeDNormStrategy(NormStrategy):
    """SeeDNorm: pre-norm with [tanh(x . beta) alpha + gamma] * x / RMS(x); equals RMSNorm at init (beta = 0).

    For language models the paper uses one head (one dot product over all channels); for vision a
    multi-head form, each head's gain driven by its own channels, with the dot product divided by
    the head width and dropout on the dynamic term. The defaults pick that form from the stack.

    Args:
        heads: heads of the dynamic gain (None: 1 for LMs, 16 for encoders such as ViT); must divide d_model.
        alpha_init: initial alpha (the paper: 1; 0.1 learned worse, 10 was unstable).
        eps: added to mean(x^2) under the square root.
        mean_dot: divide each head's dot product by the head width (None: no for LMs, yes for encoders).
        dropout: dropout on the dynamic term (the paper's vision recipe uses the drop-path rate).
    """

    # beta starts at zero: the gain is alpha-free, SeeDNorm is RMSNorm.
    init_identities = (InitIdentity("rmsnorm"),)

    SITES = (Site.ATTN_IN, Site.MLP_IN, Site.FINAL)

    def __init__(self, heads: int | None = None, alpha_init: float = 1.0, eps: float = 1e-6,
                 mean_dot: bool | None = None, dropout: float = 0.0):
        if heads is not None and heads < 1:
            raise ValueError(f"heads must be a positive divisor of d_model, got {heads}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.heads, self.alpha_init, self.eps, self.mean_dot, self.dropout = heads, alpha_init, eps, mean_dot, dropout

    def site(self, site: str, dim: int, layer: int | None, stack: StackInfo) -> nn.Module | None:
        if site not in self.SITES:
            return None
        heads = self.heads if self.heads is not None else (1 if stack.causal else ENCODER_HEADS)
        if dim % heads:
            raise PluginError(f"norm seednorm: {heads} heads do not divide the width {dim}; "
                              f"set norm_options.heads to a divisor of {dim}")
        mean_dot = (not stack.causal) if self.mean_dot is None else self.mean_dot
        return SeeDNorm(dim, heads, self.alpha_init, self.eps, mean_dot, self.dropout)
