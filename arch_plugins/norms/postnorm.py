"""Post-norm: normalise the stream after each residual sum (the original Transformer, BERT)."""

from __future__ import annotations

from torch import nn

from arch_plugins.interfaces import NormStrategy, Site, StackInfo
from arch_plugins.norms.prenorm import base_norm


class PostNormStrategy(NormStrategy):
    """Post-norm: h = norm(h + f(h)) after every sublayer (layernorm or rmsnorm); no final norm by default.

    Args:
        base: the norm layer, ``rmsnorm`` or ``layernorm``.
        eps: that layer's epsilon (None: its own default).
        final_norm: add a norm before the head. Off by default, as in the original Transformer and
            BERT: the last sublayer's norm already hands the head a normalised stream. On in the
            LLaMA-style Post-LN baselines of the Mix-LN and LayerNorm-Scaling repos (NORM_TYPE=post keeps
            LlamaModel.norm, pixeli99/MixLN modeling_llama.py:1077), which recipes/gpt_postnorm.yaml follows.
    """

    SITES = (Site.ATTN_AFTER_ADD, Site.MLP_AFTER_ADD)

    def __init__(self, base: str = "rmsnorm", eps: float | None = None, final_norm: bool = False):
        self.base, self.final_norm = base_norm(base, eps), final_norm

    def site(self, site: str, dim: int, layer: int | None, stack: StackInfo) -> nn.Module | None:
        if site in self.SITES or (site == Site.FINAL and self.final_norm):
            return self.base.make_norm(dim)
        return None
