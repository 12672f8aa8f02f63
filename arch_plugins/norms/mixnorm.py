"""Mix-LN (Li, Yin, Liu; ICLR 2025): post-norm in the first layers, pre-norm in the rest."""

from __future__ import annotations

import math

from torch import nn

from arch_plugins.init_identity import InitIdentity
from arch_plugins.interfaces import NormStrategy, Site, StackInfo
from arch_plugins.norms.prenorm import base_norm


class MixNormStrategy(NormStrategy):
    """Mix-LN: post-norm for the first ``fraction`` of the layers (0.25), pre-norm after; final norm kept.

    Post-norm early keeps the gradients of the deep layers healthy; pre-norm late keeps training
    stable. Layers with 0-based index below ``floor(fraction * num_layers)`` are post-norm, as
    ``POST_NUM`` in the authors' code (their examples: 3 of 12 layers, 6 of 24).

    Args:
        fraction: share of the layers, counted from the first, that use post-norm, in [0, 1]. 0 is
            pre-norm everywhere; 1 is post-norm everywhere (with a final norm).
        base: the norm layer, ``rmsnorm`` or ``layernorm``.
        eps: that layer's epsilon (None: its own default).
    """

    # No post-norm layer, or only post-norm layers (with a final norm).
    init_identities = (InitIdentity("rmsnorm", {"fraction": 0.0}),
                       InitIdentity("postnorm", {"fraction": 1.0}, {"final_norm": True}))

    PRE_SITES = (Site.ATTN_IN, Site.MLP_IN)
    POST_SITES = (Site.ATTN_AFTER_ADD, Site.MLP_AFTER_ADD)

    def __init__(self, fraction: float = 0.25, base: str = "rmsnorm", eps: float | None = None):
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"fraction is the share of layers that use post-norm; give a value in [0, 1], "
                             f"got {fraction}")
        self.fraction, self.base = fraction, base_norm(base, eps)

    def post_norm_layers(self, stack: StackInfo) -> int:
        # The small tolerance keeps e.g. 0.29 * 100 = 28.999999999999996 from losing a layer.
        return math.floor(self.fraction * stack.num_layers + 1e-9)

    def site(self, site: str, dim: int, layer: int | None, stack: StackInfo) -> nn.Module | None:
        if site == Site.FINAL:
            return self.base.make_norm(dim)
        if layer is None:
            return None
        sites = self.POST_SITES if layer < self.post_norm_layers(stack) else self.PRE_SITES
        return self.base.make_norm(dim) if site in sites else None
