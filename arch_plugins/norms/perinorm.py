"""Peri-LN (Kim et al., ICML 2025): a norm on each sublayer's input and on its output, before the sum."""

from __future__ import annotations

from torch import nn

from arch_plugins.interfaces import NormStrategy, Site, StackInfo
from arch_plugins.norms.prenorm import base_norm


class PeriNormStrategy(NormStrategy):
    """Peri-LN: h = h + norm_out(f(norm_in(h))), final norm kept, embedding normalised by default.

    The same placement as Gemma 2/3's "sandwich" norm and OLMo 2's output norm.

    Args:
        base: the norm layer, ``rmsnorm`` or ``layernorm``.
        eps: that layer's epsilon (None: its own default).
        embedding_norm: normalise the embedding before the first block (Peri-LN's optional input
            norm). On by default: every sublayer adds a unit-scale (normalised) output to the stream,
            and an embedding left at its init scale (std 0.02) would be drowned by the first sums.
    """

    SITES = (Site.ATTN_IN, Site.ATTN_OUT, Site.MLP_IN, Site.MLP_OUT, Site.FINAL)

    def __init__(self, base: str = "rmsnorm", eps: float | None = None, embedding_norm: bool = True):
        self.base, self.embedding_norm = base_norm(base, eps), embedding_norm

    def site(self, site: str, dim: int, layer: int | None, stack: StackInfo) -> nn.Module | None:
        if site in self.SITES or (site == Site.EMBEDDING and self.embedding_norm):
            return self.base.make_norm(dim)
        return None
