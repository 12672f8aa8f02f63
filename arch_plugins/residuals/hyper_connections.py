"""Hyper-connections (Zhu et al., ByteDance, ICLR 2025, arXiv 2409.19606): n residual streams mixed by learned weights.

The stream is n copies wide between blocks, (..., n, d). Around each sublayer f (attention or MLP), with H the n
streams, the hyper-connection is an (n+1) x (n+1) matrix [[0, beta], [alpha_m, alpha_r]]::

    x   = sum_s alpha_m[s] H_s                       width connection: what f reads
    H_t <- sum_s alpha_r[s, t] H_s + beta_t f(x)     depth connection: f's output written back into every stream

Static hyper-connections learn alpha and beta as plain parameters. Dynamic ones add an input-dependent part,
computed from H_bar = RMSNorm(H) per stream::

    alpha = static_alpha + s_alpha * tanh(H_bar W_alpha)      (per stream s: a row of n + 1 values)
    beta  = static_beta  + s_beta  * tanh(H_bar W_beta)

Init (the paper's, as lucidrains/hyper-connections implements it): static_alpha = [e_(k mod n) | I_n] for the
k-th sublayer (attention of block i is k = 2i, its MLP 2i + 1), static_beta = 1, W = 0, s = 0.01. So at init
sublayer k reads stream k mod n and writes to all streams, and with n = 1 every step is h + f(h) exactly. The
stack repeats the embedding into the n streams before the first block and sums them after the last (``begin``
and ``end`` of the residual's stream), before the final norm.

Differences from the reference, on purpose: the mixing runs in the stream's own dtype with autocast off (float32
under bf16 autocast, unless ``stream_dtype="compute"`` carries the streams in bf16), so the carried streams keep the
precision of the plain residual's stream (TF32, if a user enables it for float32 matmuls, would round them); the
paper normalises H with LayerNorm, the reference (and this) with RMSNorm with a learned gain. The
manifold-constrained variant (mHC, Sinkhorn-projected mixing) shares the merge's mixing
(``manifold_hyper_connections.py``).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from arch_plugins.autocast import autocast_dtype, autocast_off
from arch_plugins.declarations import declare_role, declare_roles, declare_weight_decay
from arch_plugins.init_identity import InitIdentity
from arch_plugins.interfaces import Kind, ResidualHistory, ResidualMerge, ResidualStream, ResidualType, Role, StackInfo


class StreamMixing(ResidualMerge):
    """A merge over n streams given one mixing matrix per sublayer, lucidrains' ``width_connection`` shape.

    M is (n + 1) x n (static, or one per token), indexed [row, source stream]: row 0 is what the branch reads, rows
    1..n the streams before the branch is added; b (n) is how much of the branch each stream receives. Per sublayer
    the coefficients are computed once and the streams mixed once, M H giving the branch input and the mixed
    streams together; the merge then adds b_t f. Subclasses say how M and b are made (``connect``), each as one
    autograd node with a hand-written backward over the coefficients and the mix: autograd through the coefficients'
    small ops on (tokens, n, n + 2) tensors dispatched more than two backward ops per forward op (broadcast sums,
    slice scatters, detaches of saved outputs), each a kernel launch on a GPU (issue 43).

    ``branch_input`` keeps (H, mixed streams, b) for the merge of the same sublayer, which the block calls next with
    the same H: that call uses them and forgets them. A merge called on other streams (or alone) computes them
    again.
    """

    _pending: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def connect(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(branch input (..., d), mixed streams (..., n, d), b as a column: (..., n, 1) per token or (n, 1))."""
        raise NotImplementedError

    def branch_input(self, h: torch.Tensor, history: ResidualHistory) -> torch.Tensor:
        branch, mixed, beta = self.connect(h)
        self._pending = (h, mixed, beta)
        return branch

    def forward(self, h: torch.Tensor, branch: torch.Tensor, history: ResidualHistory) -> torch.Tensor:
        pending, self._pending = self._pending, None
        if pending is not None and pending[0] is h:
            _, mixed, beta = pending
        else:
            _, mixed, beta = self.connect(h)
        return _Merge.apply(mixed, beta, branch)

    def __getstate__(self):
        # Copies and pickles never carry one forward pass's streams (a deepcopy of non-leaf tensors would fail).
        state = dict(super().__getstate__())
        state.pop("_pending", None)
        return state


def upcasts_exactly(source: torch.dtype, target: torch.dtype) -> bool:
    """Whether ``source`` values are ``target`` values (bf16 or fp16 into float32, any of them into float64), so
    that an op's type promotion to ``target`` reads them as a cast would, with no copy."""
    return source == target or (source.is_floating_point and target in (torch.float32, torch.float64)
                                and source.itemsize < target.itemsize)


class _Merge(torch.autograd.Function):
    """H_t <- mixed_t + b_t f, one addcmul, with autograd's backward for it written out: autograd's multiplies the
    branch (and b) by addcmul's value, 1, before using them, a pass over the branch and an op for nothing."""

    @staticmethod
    def forward(ctx, mixed: torch.Tensor, beta: torch.Tensor, branch: torch.Tensor) -> torch.Tensor:
        ctx.dtypes = beta.dtype, branch.dtype
        beta = beta.to(mixed.dtype)
        # A bf16 branch into float32 streams is an exact upcast, which addcmul's type promotion does as it reads: no
        # float32 copy of the branch (nor one kept for the backward). Any other mismatch rounds, as before.
        if not upcasts_exactly(branch.dtype, mixed.dtype):
            branch = branch.to(mixed.dtype)
        row = branch.unsqueeze(-2)
        ctx.save_for_backward(beta, row)
        return torch.addcmul(mixed, beta, row)

    @staticmethod
    @once_differentiable
    def backward(ctx, g: torch.Tensor):
        beta, row = ctx.saved_tensors
        beta_dtype, branch_dtype = ctx.dtypes
        return g, (g * row).sum_to_size(beta.shape).to(beta_dtype), (g * beta).sum(-2).to(branch_dtype)


def mix(rows: torch.Tensor, streams: torch.Tensor, lead: torch.Size) -> tuple[torch.Tensor, torch.Tensor]:
    """M H for (N, n + 1, n) rows M and (N, n, d) streams H (N tokens, ``lead`` their shape): the branch input
    (*lead, d) and the mixed streams (*lead, n, d), in the streams' dtype. Call it with autocast off: it would run
    the matmul in bf16 and round the carried streams, which the plain residual keeps in float32.

    One batched matmul that reads the streams where they lie; a static M comes as a stride-0 batch, never copied.
    """
    n, d = streams.shape[-2:]
    out = torch.bmm(rows, streams).view(*lead, n + 1, d)
    # A copy (one N x d pass): the sublayer keeps its input for the backward, and a view would keep the whole
    # (n + 1)-row mix alive with it, one more copy of the streams per sublayer until the backward.
    return out[..., 0, :].contiguous(), out[..., 1:, :]


def mix_grad(g_branch: torch.Tensor, g_mixed: torch.Tensor, streams: torch.Tensor) -> torch.Tensor:
    """The gradient of ``mix``'s output rows, (N, n + 1, d), from its two outputs' (``streams`` gives the shape)."""
    n, d = streams.shape[-2:]
    return torch.cat([g_branch.reshape(-1, 1, d), g_mixed.reshape(-1, n, d)], dim=1)


def autocast_matmul_input(x: torch.Tensor) -> torch.Tensor:
    """``x`` cast as autocast casts a matmul's input (to its lower dtype, if floating and not float64), done by hand
    so that the backward can keep the cast copy, as autograd through an autocast matmul keeps it."""
    dtype = autocast_dtype(x.device.type)
    if dtype is not None and x.dtype.is_floating_point and x.dtype != torch.float64:
        return x.to(dtype)
    return x


class _StaticConnection(torch.autograd.Function):
    """``mix`` with a static alpha (n, n + 1), indexed [source, row]: the mixing matrix M is its transpose."""

    @staticmethod
    def forward(ctx, alpha: torch.Tensor, h: torch.Tensor):
        with autocast_off(h.device.type):
            # Expanded before the transpose, so that alpha's gradient sums back into alpha's own layout (a
            # transposed one would be copied when it is accumulated).
            streams = h.reshape(-1, *h.shape[-2:])
            expanded = alpha.to(h.dtype).expand(streams.shape[0], *alpha.shape)
            branch, mixed = mix(expanded.transpose(1, 2), streams, h.shape[:-2])
        ctx.save_for_backward(expanded, streams)
        ctx.alpha_dtype = alpha.dtype
        return branch, mixed

    @staticmethod
    @once_differentiable
    def backward(ctx, g_branch, g_mixed):
        expanded, streams = ctx.saved_tensors
        g_out = mix_grad(g_branch, g_mixed, streams)
        g_alpha = torch.bmm(streams, g_out.transpose(1, 2)).sum(0).to(ctx.alpha_dtype)
        g_h = torch.bmm(expanded, g_out).view(g_mixed.shape)
        return g_alpha, g_h


class _DynamicConnection(torch.autograd.Function):
    """Dynamic hyper-connections' coefficients and mix (``HyperConnection``'s math, one node).

    Forward, per token and stream s (H_s of width d, W = [W_alpha | W_beta], g the norm gain)::

        r       = sqrt(d) / max(|H_s|, 1e-12)
        D       = tanh(r * (H_s @ (g * W)))        the matmul as autocast runs it (its dtype, inputs cast)
        alpha   = static_alpha + s_alpha * D[:n+1]   beta = static_beta + s_beta * D[n+1]

    then ``mix`` with M = alpha^T. The backward is autograd's for the same ops, written out: each gradient in the
    dtype autograd would compute it in, except that the stream's three gradient terms (the mix, the matmul, the
    norm) are summed before one cast to the stream's dtype (bf16 streams: one rounding where autograd has three).
    """

    @staticmethod
    def forward(ctx, h, gain, w_alpha, w_beta, s_alpha, s_beta, static_alpha, static_beta, tanh: bool):
        lead, (n, d) = h.shape[:-2], h.shape[-2:]
        streams = h.reshape(-1, n, d)
        norm = torch.linalg.vector_norm(streams, dim=-1, keepdim=True)
        inverse = math.sqrt(d) / norm.clamp_min(1e-12)
        weight = torch.cat([w_alpha, w_beta.unsqueeze(-1)], dim=-1)
        gain_column = gain.unsqueeze(-1)
        # Cast before the reshape: the first block's streams are one stream expanded (stride 0), which the cast
        # makes contiguous, so that only a float32 matmul copies them.
        h_mm = autocast_matmul_input(streams).reshape(-1, d)
        w_mm = autocast_matmul_input((gain_column * weight).to(h.dtype))
        product = torch.mm(h_mm, w_mm).view(-1, n, n + 2)
        dynamic = product * inverse
        if tanh:
            dynamic = dynamic.tanh()
        d_alpha, d_beta = dynamic[..., :-1], dynamic[..., -1:]
        alpha = static_alpha + d_alpha * s_alpha  # (N, n, n + 1)
        beta = static_beta.unsqueeze(-1) + d_beta * s_beta  # (N, n, 1)
        with autocast_off(h.device.type):
            alpha_h = alpha.to(h.dtype)
            branch, mixed = mix(alpha_h.transpose(1, 2), streams, lead)
        ctx.tanh = tanh
        ctx.dtypes = (h.dtype, gain.dtype, s_alpha.dtype, s_beta.dtype, static_alpha.dtype, static_beta.dtype,
                      alpha.dtype, weight.dtype)
        ctx.save_for_backward(streams, h_mm, w_mm, weight, gain, gain_column, norm, inverse, product, dynamic,
                              d_alpha, d_beta, s_alpha, s_beta, alpha_h)
        return branch, mixed, beta.view(*lead, n, 1)

    @staticmethod
    @once_differentiable
    def backward(ctx, g_branch, g_mixed, g_beta):
        (streams, h_mm, w_mm, weight, gain, gain_column, norm, inverse, product, dynamic, d_alpha, d_beta, s_alpha,
         s_beta, alpha_h) = ctx.saved_tensors
        h_dtype, gain_dtype, s_alpha_dtype, s_beta_dtype, static_alpha_dtype, static_beta_dtype, alpha_dtype, \
            weight_dtype = ctx.dtypes
        n, d = streams.shape[-2:]
        g_out = mix_grad(g_branch, g_mixed, streams)
        g_alpha = torch.bmm(streams, g_out.transpose(1, 2)).to(alpha_dtype)  # (N, n, n + 1)
        g_beta = g_beta.reshape(-1, n, 1)
        g_static_alpha = g_alpha.sum(0).to(static_alpha_dtype)
        g_static_beta = g_beta.sum((0, 2)).to(static_beta_dtype)
        g_alpha, g_beta = g_alpha.to(dynamic.dtype), g_beta.to(dynamic.dtype)
        g_s_alpha = (g_alpha * d_alpha).sum().to(s_alpha_dtype)
        g_s_beta = (g_beta * d_beta).sum().to(s_beta_dtype)
        g_dynamic = torch.cat([g_alpha * s_alpha, g_beta * s_beta], dim=-1)
        if ctx.tanh:
            g_dynamic = torch.ops.aten.tanh_backward(g_dynamic, dynamic)
        g_product = (g_dynamic * inverse).to(product.dtype)
        g_inverse = (g_dynamic * product).sum(-1, keepdim=True).to(inverse.dtype)
        g_product_2d = g_product.view(-1, n + 2)
        g_h_mm = torch.mm(g_product_2d, w_mm.t()).view(streams.shape).to(h_dtype)
        g_weighted = torch.mm(h_mm.t(), g_product_2d).to(h_dtype).to(weight_dtype)  # d(g * W)
        g_w_alpha = g_weighted[:, :-1] * gain_column
        g_w_beta = g_weighted[:, -1] * gain
        g_gain = (g_weighted * weight).sum(-1).to(gain_dtype)
        # r = sqrt(d) / max(|H_s|, 1e-12): dr/dH_s = -(r^2 / sqrt(d)) H_s / |H_s| where |H_s| > 1e-12 (clamp's
        # gradient), zero elsewhere (which also covers the norm's own 0/0 at H_s = 0).
        through_norm = (g_inverse * inverse * inverse / norm).masked_fill_(norm <= 1e-12, 0)
        g_h = torch.addcmul(g_h_mm, through_norm, streams, value=-1 / math.sqrt(d)).to(h_dtype)
        g_h = torch.baddbmm(g_h, alpha_h, g_out).view(g_mixed.shape)
        return g_h, g_gain, g_w_alpha, g_w_beta, g_s_alpha, g_s_beta, g_static_alpha, g_static_beta, None


class HyperConnection(StreamMixing):
    """One sublayer's width connection (``branch_input``) and depth connection (``forward``) over n streams."""

    def __init__(self, dim: int, streams: int, index: int, *, dynamic: bool, tanh: bool, dynamic_scale: float):
        super().__init__()
        self.streams, self.dynamic, self.tanh = streams, dynamic, tanh
        static_alpha = torch.zeros(streams, streams + 1)
        static_alpha[index % streams, 0] = 1.0
        static_alpha[:, 1:] = torch.eye(streams)
        self.static_alpha = nn.Parameter(static_alpha)
        self.static_beta = nn.Parameter(torch.ones(streams))
        # The static matrix is the residual connection itself: decaying it towards zero would erase the identity.
        declare_weight_decay(self, "static_alpha", False)
        # The stream-mixing weights are n x (n+1) and n numbers, whatever the width.
        declare_roles(self, {"static_alpha": "hc_static_alpha", "static_beta": "hc_static_beta"}, kind=Kind.SCALAR,
                      group="residual")
        if dynamic:
            self.norm_gain = nn.Parameter(torch.ones(dim))
            self.dynamic_alpha = nn.Parameter(torch.zeros(dim, streams + 1))
            self.dynamic_alpha_scale = nn.Parameter(torch.tensor(dynamic_scale))
            self.dynamic_beta = nn.Parameter(torch.zeros(dim))
            self.dynamic_beta_scale = nn.Parameter(torch.tensor(dynamic_scale))
            declare_role(self, "norm_gain", Role.GAIN, group="residual")
            # d -> n+1 and d -> 1 read-outs of the stream (h @ W: the fan-in is dim 0): muP's readout rules.
            declare_roles(self, {"dynamic_alpha": "hc_dynamic_alpha", "dynamic_beta": "hc_dynamic_beta"},
                          kind=Kind.READOUT, group="residual", fan_in_dim=0)
            declare_weight_decay(self, "dynamic_beta", False)  # a vector before roles existed: kept undecayed
            declare_roles(self, {"dynamic_alpha_scale": "hc_dynamic_scale", "dynamic_beta_scale": "hc_dynamic_scale"},
                          kind=Kind.SCALAR, group="residual")
            # A matrix, so it decayed before roles existed (the rule was ndim >= 2); kept so that runs compare.
            declare_weight_decay(self, "dynamic_alpha", True)

    def connect(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.dynamic:
            return _DynamicConnection.apply(h, self.norm_gain, self.dynamic_alpha, self.dynamic_beta,
                                            self.dynamic_alpha_scale, self.dynamic_beta_scale, self.static_alpha,
                                            self.static_beta, self.tanh)
        branch, mixed = _StaticConnection.apply(self.static_alpha, h)
        return branch, mixed, self.static_beta.unsqueeze(-1)


class Streams(ResidualStream):
    """Repeats the embedding into n streams before the first block and sums (or averages) them after the last.

    With ``stream_dtype="compute"`` the streams are carried in autocast's dtype while autocast is on (bf16 streams
    under bf16 autocast: half the bytes of every pass over them, and the mixing and merge then run in it too); in
    float32 otherwise, as the plain residual's stream.
    """

    def __init__(self, streams: int, reduce: str = "sum", stream_dtype: str = "float32"):
        super().__init__()
        self.streams, self.reduce, self.stream_dtype = streams, reduce, stream_dtype

    def begin(self, x: torch.Tensor, history: ResidualHistory) -> torch.Tensor:
        if self.stream_dtype == "compute" and (dtype := autocast_dtype(x.device.type)) is not None:
            x = x.to(dtype)
        return x.unsqueeze(-2).expand(*x.shape[:-1], self.streams, x.shape[-1])

    def end(self, h: torch.Tensor, history: ResidualHistory) -> torch.Tensor:
        return h.mean(-2) if self.reduce == "mean" else h.sum(-2)


class MultiStreamResidual(ResidualType):
    """A residual type carrying n streams between the blocks (``streams`` validated once for every such type)."""

    reduce = "sum"  # how the streams become one after the last block

    def __init__(self, streams: int, stream_dtype: str = "float32"):
        if not isinstance(streams, int) or isinstance(streams, bool) or streams < 1:
            raise ValueError(f"streams is the number of residual streams n (the paper uses 4); give an integer >= 1, "
                             f"got {streams!r}")
        if stream_dtype not in STREAM_DTYPES:
            raise ValueError(f"stream_dtype is the dtype the n streams are carried in: give one of "
                             f"{', '.join(STREAM_DTYPES)}, got {stream_dtype!r}")
        self.streams, self.stream_dtype = streams, stream_dtype

    def stream(self, stack: StackInfo) -> Streams:
        return Streams(self.streams, self.reduce, self.stream_dtype)


# "float32": the streams keep the plain residual's float32; "compute": autocast's dtype while autocast is on.
STREAM_DTYPES = ("float32", "compute")


class HyperConnections(MultiStreamResidual):
    """Hyper-connections: n residual streams mixed per sublayer by learned (dynamic: input-dependent) weights.

    Args:
        streams: n, the expansion rate (the paper's main results use 4); 1 is the plain residual at init.
        dynamic: DHC (the paper's best: weights depend on the streams through tanh(RMSNorm(H) W)) or SHC (static).
        tanh: the tanh on the dynamic part (the reference's default).
        dynamic_scale: initial s_alpha, s_beta (0.01 as the reference).
        stream_dtype: "float32" (default) or "compute": the streams in autocast's dtype while autocast is on.
    """

    # One stream: the width and depth connections are 1, the dynamic parts start at zero.
    init_identities = (InitIdentity("add", {"streams": 1}),)

    def __init__(self, streams: int = 4, dynamic: bool = True, tanh: bool = True, dynamic_scale: float = 0.01,
                 stream_dtype: str = "float32"):
        super().__init__(streams, stream_dtype)
        self.dynamic, self.tanh, self.dynamic_scale = dynamic, tanh, dynamic_scale

    def merge(self, sublayer: str, layer: int, stack: StackInfo) -> HyperConnection:
        index = 2 * layer + (0 if sublayer == "attn" else 1)
        return HyperConnection(stack.d_model, self.streams, index, dynamic=self.dynamic, tanh=self.tanh,
                               dynamic_scale=self.dynamic_scale)


class StaticHyperConnections(HyperConnections):
    """Static hyper-connections (SHC): n residual streams mixed per sublayer by learned, input-independent weights.

    Args:
        streams: n, the expansion rate (the paper uses 4); 1 is the plain residual at init.
        stream_dtype: "float32" (default) or "compute": the streams in autocast's dtype while autocast is on.
    """

    def __init__(self, streams: int = 4, stream_dtype: str = "float32"):
        super().__init__(streams=streams, dynamic=False, stream_dtype=stream_dtype)
