"""DyT, Dynamic Tanh (Zhu, Chen, He, LeCun, Liu; CVPR 2025): a normalisation layer with no statistics."""

from __future__ import annotations

import math

import torch
from torch import nn

from arch_plugins.diagnostics import declare_diagnostic
from arch_plugins.interfaces import NormStrategy, Site, StackInfo

# The authors' initial alpha per site. Language models: their LLaMA-2 7B values (attention norm, FFN
# norm, final norm), the largest in their table: they lower alpha as models grow, and ours are small.
# Everything else (ViT, ConvNeXt, DiT, ...): 0.5 at every site.
LM_ALPHA = {Site.ATTN_IN: 0.8, Site.MLP_IN: 0.2, Site.FINAL: 0.2}
ENCODER_ALPHA = 0.5


class DynamicTanh(nn.Module):
    """gamma * tanh(alpha * x) + beta, alpha one learnable scalar, gamma and beta per channel."""

    def __init__(self, dim: int, alpha_init: float, bias: bool):
        super().__init__()
        self.alpha = nn.Parameter(torch.full((1,), float(alpha_init)))
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None
        declare_diagnostic(self, "alpha")  # the paper tracks how alpha follows 1/std of the input

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.weight * torch.tanh(self.alpha * x)
        return y + self.bias if self.bias is not None else y


class LearnableScale(nn.Module):
    """x * s with s one learnable scalar."""

    def __init__(self, init: float):
        super().__init__()
        self.scale = nn.Parameter(torch.full((1,), float(init)))
        declare_diagnostic(self, "scale")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


class DyTStrategy(NormStrategy):
    """DyT: every pre-norm layer (attention, MLP, final) replaced by gamma * tanh(alpha * x) + beta.

    Defaults follow the authors' code for the kind of stack: for a language model (causal stack)
    alpha starts at 0.8 / 0.2 / 0.2 (attention / MLP / final), there is no beta, and a learnable
    scalar initialised to sqrt(d_model) multiplies the embedding (their LLaMA), which lifts the
    stream out of the near-linear region of tanh that a 0.02-std embedding would sit in. For an
    encoder (ViT) alpha starts at 0.5 everywhere, beta is learned, and the embedding is untouched.

    Args:
        alpha_attn: initial alpha of the attention-input DyT (None: 0.8 for LMs, 0.5 for encoders).
        alpha_mlp: initial alpha of the MLP-input DyT (None: 0.2 for LMs, 0.5 for encoders).
        alpha_final: initial alpha of the DyT before the head (None: 0.2 for LMs, 0.5 for encoders).
        bias: learn beta (None: no for LMs, yes for encoders).
        embedding_scale: multiply the embedding by a learnable scalar initialised to sqrt(d_model)
            (None: yes for LMs, no for encoders).
    """

    SITES = (Site.ATTN_IN, Site.MLP_IN, Site.FINAL)

    def __init__(self, alpha_attn: float | None = None, alpha_mlp: float | None = None,
                 alpha_final: float | None = None, bias: bool | None = None, embedding_scale: bool | None = None):
        alphas = {Site.ATTN_IN: alpha_attn, Site.MLP_IN: alpha_mlp, Site.FINAL: alpha_final}
        for site, alpha in alphas.items():
            if alpha is not None and not (math.isfinite(alpha) and alpha > 0):
                raise ValueError(f"the initial alpha at {site} must be a positive number, got {alpha}")
        self.alphas, self.bias, self.embedding_scale = alphas, bias, embedding_scale

    def initial_alpha(self, site: str, stack: StackInfo) -> float:
        chosen = self.alphas[site]
        if chosen is not None:
            return chosen
        return LM_ALPHA[site] if stack.causal else ENCODER_ALPHA

    def site(self, site: str, dim: int, layer: int | None, stack: StackInfo) -> nn.Module | None:
        if site in self.SITES:
            bias = (not stack.causal) if self.bias is None else self.bias
            return DynamicTanh(dim, self.initial_alpha(site, stack), bias)
        if site == Site.EMBEDDING and (stack.causal if self.embedding_scale is None else self.embedding_scale):
            return LearnableScale(math.sqrt(dim))
        return None
