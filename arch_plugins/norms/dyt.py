"""DyT, Dynamic Tanh (Zhu, Chen, He, LeCun, Liu; CVPR 2025): a normalisation layer with no statistics."""

from __future__ import annotations

import math

import torch
from torch import nn

from arch_plugins.declarations import declare_diagnostic, declare_role, declare_roles, declare_weight_decay
from arch_plugins.interfaces import Kind, NormStrategy, Role, Site, StackInfo

# The authors' initial alpha for language models, chosen by width (DyT paper, arXiv 2503.10622, Table 11:
# "Model width significantly impacts the choice of alpha0, with wider networks requiring smaller values. In
# contrast, model depth has negligible influence"). Rows: the largest d_model a row covers, then alpha0 at the
# attention norm and at the other norms (FFN and final). Table 11 has rows at widths 1024, 2048, 4096 and 8192;
# a width between two rows takes the next wider row's values, and anything narrower than 1024 takes the
# 1024 row (the table does not go below it). The LLaMA-2 7B values (0.8 / 0.2, width 4096) are only right there.
# Everything else (ViT, ConvNeXt, DiT, ...): 0.5 at every site (their dynamic_tanh.py).
LM_ALPHA_BY_WIDTH = ((1024, 1.0, 1.0), (2048, 1.0, 0.5), (4096, 0.8, 0.2), (math.inf, 0.2, 0.05))
ENCODER_ALPHA = 0.5


def lm_alpha(site: str, d_model: int) -> float:
    """The paper's initial alpha for a language model of width ``d_model`` at ``site`` (Table 11)."""
    for max_width, attn, other in LM_ALPHA_BY_WIDTH:
        if d_model <= max_width:
            return attn if site == Site.ATTN_IN else other
    raise AssertionError("unreachable: the last row covers every width")


class DynamicTanh(nn.Module):
    """gamma * tanh(alpha * x) + beta, alpha one learnable scalar, gamma and beta per channel."""

    def __init__(self, dim: int, alpha_init: float, bias: bool):
        super().__init__()
        self.alpha = nn.Parameter(torch.full((1,), float(alpha_init)))
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None
        declare_roles(self, {"weight": Role.GAIN, "bias": Role.BIAS})
        declare_role(self, "alpha", "dyt_alpha", kind=Kind.SCALAR, group="norms")
        declare_diagnostic(self, "alpha")  # the paper tracks how alpha follows 1/std of the input

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.weight * torch.tanh(self.alpha * x)
        return y + self.bias if self.bias is not None else y


class EmbeddingScale(nn.Module):
    """x * s with s one learnable scalar (DyT's scale of the token embeddings, started at sqrt(d_model)).

    Not ``arch_plugins.learned_scale.LearnedScale``, nGPT's stored-at-one-value, used-at-another vector.
    """

    def __init__(self, init: float):
        super().__init__()
        self.scale = nn.Parameter(torch.full((1,), float(init)))
        declare_role(self, "scale", "embedding_scale", kind=Kind.SCALAR, group="norms")
        declare_diagnostic(self, "scale")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


class DyTStrategy(NormStrategy):
    """DyT: every pre-norm layer (attention, MLP, final) replaced by gamma * tanh(alpha * x) + beta.

    Defaults follow the authors' paper and code for the kind of stack: for a language model (causal
    stack) alpha starts at the paper's width rule (Table 11, by d_model: 1.0 / 1.0 / 1.0 (attention /
    MLP / final) up to 1024, 1.0 / 0.5 / 0.5 up to 2048, 0.8 / 0.2 / 0.2 up to 4096 (their LLaMA-2 7B),
    0.2 / 0.05 / 0.05 beyond), there is no beta, and a learnable
    scalar initialised to sqrt(d_model) multiplies the embedding (their LLaMA), which lifts the
    stream out of the near-linear region of tanh that a 0.02-std embedding would sit in. (It lifts it
    to rms 0.02 * sqrt(d_model): 1.28 in their 7B, 0.23 at d_model 128, so a narrow model still sits
    further into the linear region than any of the paper's; the table gives nothing below width 1024.)
    For an encoder (ViT) alpha starts at 0.5 everywhere, beta is learned, and the embedding is untouched.

    Args:
        alpha_attn: initial alpha of the attention-input DyT (None: the width rule for LMs, 0.5 for encoders).
        alpha_mlp: initial alpha of the MLP-input DyT (None: the width rule for LMs, 0.5 for encoders).
        alpha_final: initial alpha of the DyT before the head (None: the width rule for LMs, 0.5 for encoders).
        bias: learn beta (None: no for LMs, yes for encoders).
        embedding_scale: multiply the embedding by a learnable scalar initialised to sqrt(d_model)
            (None: yes for LMs, no for encoders).
        decay_all: decay alpha, gamma, beta and the embedding scalar at the run's weight decay, as the
            authors' LLaMA code does (``main_training_llama.py:119-121``: AdamW over
            ``model.parameters()``, weight_decay 0.1); otherwise they are vectors and do not decay, as in
            their ViT code (``optim_factory.py:77`` skips 1-D parameters). None: yes for LMs, no for encoders.
    """

    SITES = (Site.ATTN_IN, Site.MLP_IN, Site.FINAL)

    def __init__(self, alpha_attn: float | None = None, alpha_mlp: float | None = None,
                 alpha_final: float | None = None, bias: bool | None = None, embedding_scale: bool | None = None,
                 decay_all: bool | None = None):
        alphas = {Site.ATTN_IN: alpha_attn, Site.MLP_IN: alpha_mlp, Site.FINAL: alpha_final}
        for site, alpha in alphas.items():
            if alpha is not None and not (math.isfinite(alpha) and alpha > 0):
                raise ValueError(f"the initial alpha at {site} must be a positive number, got {alpha}")
        self.alphas, self.bias, self.embedding_scale, self.decay_all = alphas, bias, embedding_scale, decay_all

    def initial_alpha(self, site: str, stack: StackInfo) -> float:
        chosen = self.alphas[site]
        if chosen is not None:
            return chosen
        return lm_alpha(site, stack.d_model) if stack.causal else ENCODER_ALPHA

    def site(self, site: str, dim: int, layer: int | None, stack: StackInfo) -> nn.Module | None:
        if site in self.SITES:
            bias = (not stack.causal) if self.bias is None else self.bias
            module = DynamicTanh(dim, self.initial_alpha(site, stack), bias)
        elif site == Site.EMBEDDING and (stack.causal if self.embedding_scale is None else self.embedding_scale):
            module = EmbeddingScale(math.sqrt(dim))
        else:
            return None
        if stack.causal if self.decay_all is None else self.decay_all:
            for name, _ in module.named_parameters(recurse=False):
                declare_weight_decay(module, name, True)
        return module
