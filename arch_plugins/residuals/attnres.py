"""Attention Residuals, AttnRes (Kimi Team, arXiv 2603.15031): each sublayer reads a softmax over depth.

Every attention and every MLP sublayer is one "layer" l. Instead of h_l = h_{l-1} + f_{l-1}(h_{l-1}), the input of
sublayer l is an attention over the outputs of the layers before it, with one learned pseudo-query w_l per
sublayer and an RMSNorm on the keys (the values stay raw)::

    v_0 = embedding,   v_i = f_i(h_i)
    h_l = sum_{i<l} softmax_i( w_l . RMSNorm(v_i) ) v_i

and the stack's output (before the final norm) is one more such attention, with its own pseudo-query, over every
source. w_l starts at zero (the paper: it "prevents training volatility"), so at init every sublayer reads the
*equal-weight average* of its sources, not the plain residual's sum.

Block AttnRes (``attnres_block``, the paper's practical form) groups the sublayers into blocks of S: inside a block
outputs add up as a plain residual, b_n = sum_{j in block n} f_j(h_j), and the sources are the completed blocks
b_0 = embedding, b_1, ..., b_{n-1}, plus the current block's partial sum once it has one term. Full AttnRes is
S = 1. The README's pseudocode counts ``block_size`` in sublayers (attention and MLP one each), as here.

How it maps onto the block's interface: the stream ``h`` carried between sublayers is the current block's partial
sum (the output v_l itself for Full AttnRes), so ``history.states`` holds every completed block at its block's
end and nothing is cached: ``branch_input`` attends over ``states[0]``, the completed blocks and ``h``; the merge
adds the sublayer's output to the partial sum (or starts a new one at a block boundary); the stream's ``end``
is the final aggregation. The diagnostics' stream RMS by depth is therefore the RMS of these partial sums.

The attention over depth runs in float32 (the only public code of the method, flash-attn-res, does so too),
whatever autocast does to the sublayers, and ``w . RMSNorm(v)`` is computed as ``(w * g) . v * rsqrt(mean(v^2) +
eps)``, no normalised keys in memory. Each consumer is one depth-attention op (``DepthSoftmax``, Liger-Kernel's
``ops/attn_res.py`` plan in torch ops): the sources are stacked once, in their own dtype, and upcast inside the op;
backward stacks them again from the sources it saved. What autograd keeps is the sources themselves (the history
holds them anyway) and a few per-token values per source, never a float32 copy of them: a per-source loop had kept
one per source per consumer, which at 124M width was more than the baseline's whole activation memory.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from arch_plugins.declarations import declare_diagnostic, declare_role, declare_roles, declare_weight_decay
from arch_plugins.init_identity import InitIdentity
from arch_plugins.interfaces import Kind, ResidualHistory, ResidualMerge, ResidualStream, ResidualType, Role, StackInfo
from arch_plugins.kernels.dispatch import DEPTH_SOFTMAX, check_kernel, use_triton
from arch_plugins.residuals.depth_softmax import DepthSoftmax, depth_softmax_forward

KEY_NORMS = ("rmsnorm", "rmsnorm_nonparam", "none")


class DepthAttention(nn.Module):
    """softmax_i(w . RMSNorm(v_i)) weighted sum of the sources v_i; w (the pseudo-query) starts at zero.

    ``key_norm``: ``rmsnorm`` (with a learned gain, the README pseudocode's per-sublayer ``RMSNorm`` module),
    ``rmsnorm_nonparam`` (no gain, as flash-attn-res), ``none`` (the paper's "w/o key RMSNorm" ablation).
    """

    def __init__(self, dim: int, *, key_norm: str, eps: float, kernel: str = "auto"):
        super().__init__()
        self.kernel = kernel
        self.query = nn.Parameter(torch.zeros(dim))
        self.key_gain = nn.Parameter(torch.ones(dim)) if key_norm == "rmsnorm" else None
        # w . v reads the width down to one logit: a readout (zero at init); undecayed, as before roles existed.
        declare_role(self, "query", "attnres_query", kind=Kind.READOUT, group="residual")
        declare_weight_decay(self, "query", False)
        declare_roles(self, {"key_gain": Role.GAIN}, group="residual")
        self.normalise_keys, self.eps = key_norm != "none", eps
        declare_diagnostic(self, "query_norm", _query_norm)  # |w|: how far this sublayer moved off the average

    def forward(self, sources: list[torch.Tensor]) -> torch.Tensor:
        # float32, or float64 for float64 sources (torch.promote_types would cost a dispatched op per call).
        dtype = torch.float64 if sources[0].dtype == torch.float64 else torch.float32
        query = (self.query if self.key_gain is None else self.query * self.key_gain).to(dtype)
        eps = self.eps if self.normalise_keys else None
        if use_triton(self.kernel, DEPTH_SOFTMAX, sources[-1]):
            from arch_plugins.kernels.depth_softmax import depth_softmax

            return depth_softmax(query, sources, eps)
        if not torch.is_grad_enabled():
            # Nothing to differentiate: the same forward, without the autograd.Function, which torch.compile (2.14)
            # fails to trace under no_grad when its forward takes *sources (a graph break in every eval pass).
            return depth_softmax_forward(query, eps, sources)[0]
        return DepthSoftmax.apply(query, eps, *sources)


def _query_norm(module: DepthAttention) -> torch.Tensor:
    return module.query.norm()


def depth_sources(history: ResidualHistory, h: torch.Tensor, consumer: int, block_size: int) -> list[torch.Tensor]:
    """What sublayer ``consumer`` (0-based; ``2 * n_layers`` for the final aggregation) attends over.

    ``states[j]`` is the stream after sublayer j - 1, i.e. a block's complete sum when j is a multiple of the
    block size. The latest source is always ``h``: the partial sum, or the block that just ended.
    """
    completed = [history.states[j] for j in range(block_size, consumer, block_size)]
    return [history.states[0], *completed, h]


class AttnResMerge(ResidualMerge):
    """One sublayer's depth attention (its input) and its place in the block's partial sum (its output)."""

    def __init__(self, dim: int, index: int, block_size: int, *, key_norm: str, eps: float, kernel: str = "auto"):
        super().__init__()
        self.index, self.block_size = index, block_size
        # The first sublayer has one source (the embedding): a softmax over one needs no query.
        self.attention = DepthAttention(dim, key_norm=key_norm, eps=eps, kernel=kernel) if index > 0 else None

    def branch_input(self, h: torch.Tensor, history: ResidualHistory) -> torch.Tensor:
        if self.attention is None:
            return h
        return self.attention(depth_sources(history, h, self.index, self.block_size))

    def forward(self, h: torch.Tensor, branch: torch.Tensor, history: ResidualHistory) -> torch.Tensor:
        if self.index % self.block_size == 0:
            return branch  # a new block starts; the finished one stays in history.states
        return h + branch


class AttnResOutput(ResidualStream):
    """The final aggregation over every block (its own pseudo-query) before the final norm site."""

    def __init__(self, dim: int, sublayers: int, block_size: int, *, key_norm: str, eps: float, kernel: str = "auto"):
        super().__init__()
        self.sublayers, self.block_size = sublayers, block_size
        self.attention = DepthAttention(dim, key_norm=key_norm, eps=eps, kernel=kernel)

    def end(self, h: torch.Tensor, history: ResidualHistory) -> torch.Tensor:
        return self.attention(depth_sources(history, h, self.sublayers, self.block_size))


class AttentionResiduals(ResidualType):
    """Block Attention Residuals: softmax over depth of block sums, zero-init pseudo-queries, key RMSNorm.

    Args:
        block_size: sublayers per block (attention and MLP count one each, as the reference's ``block_size``).
            None: the paper's practical default of about 8 blocks, whole transformer layers per block
            (2 * ceil(n_layers / 8) sublayers). 1 is Full AttnRes.
        key_norm: ``rmsnorm`` (learned gain), ``rmsnorm_nonparam`` or ``none`` (the paper's ablation).
        eps: the key RMSNorm's epsilon (None: float32's machine epsilon, as flash-attn-res and ``nn.RMSNorm``).
        kernel: the depth softmax as the fused Triton op (``triton``), the torch ops (``torch``), or ``auto``:
            Triton only on a GPU where it was measured faster (arch_plugins.kernels; none yet).
    """

    # Blocks of one sublayer each are Full Attention Residuals.
    init_identities = (InitIdentity("attnres", {"block_size": 1}),)

    def __init__(self, block_size: int | None = None, key_norm: str = "rmsnorm", eps: float | None = None,
                 kernel: str = "auto"):
        if block_size is not None and (not isinstance(block_size, int) or isinstance(block_size, bool)
                                       or block_size < 1):
            raise ValueError(f"block_size counts sublayers per block (attention and MLP one each); give an "
                             f"integer >= 1 (1 is Full AttnRes) or null for about 8 blocks, got {block_size!r}")
        if key_norm not in KEY_NORMS:
            raise ValueError(f"key_norm must be one of {', '.join(KEY_NORMS)}, got {key_norm!r}")
        if eps is not None and not eps > 0:
            raise ValueError(f"eps must be positive, got {eps!r}")
        self.block_size, self.key_norm, self.kernel = block_size, key_norm, check_kernel(kernel)
        self.eps = eps if eps is not None else torch.finfo(torch.float32).eps

    def sublayers_per_block(self, stack: StackInfo) -> int:
        if self.block_size is not None:
            return self.block_size
        return 2 * math.ceil(stack.num_layers / 8)

    def reads_history(self, stack: StackInfo) -> bool:
        return True  # every sublayer attends over the embedding and the completed blocks' sums

    def merge(self, sublayer: str, layer: int, stack: StackInfo) -> AttnResMerge:
        index = 2 * layer + (0 if sublayer == "attn" else 1)
        return AttnResMerge(stack.d_model, index, self.sublayers_per_block(stack), key_norm=self.key_norm,
                            eps=self.eps, kernel=self.kernel)

    def stream(self, stack: StackInfo) -> AttnResOutput:
        return AttnResOutput(stack.d_model, 2 * stack.num_layers, self.sublayers_per_block(stack),
                             key_norm=self.key_norm, eps=self.eps, kernel=self.kernel)


class FullAttentionResiduals(AttentionResiduals):
    """Full Attention Residuals: each sublayer attends over every earlier output (zero-init pseudo-queries).

    Args:
        key_norm: ``rmsnorm`` (learned gain), ``rmsnorm_nonparam`` or ``none`` (the paper's ablation).
        eps: the key RMSNorm's epsilon (None: float32's machine epsilon).
        kernel: ``auto``, ``triton`` or ``torch``, as for ``attnres_block``.
    """

    init_identities = ()  # it is what attnres_block's identity points at

    def __init__(self, key_norm: str = "rmsnorm", eps: float | None = None, kernel: str = "auto"):
        super().__init__(block_size=1, key_norm=key_norm, eps=eps, kernel=kernel)
