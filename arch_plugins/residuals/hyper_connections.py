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

from arch_plugins.declarations import declare_role, declare_roles, declare_weight_decay
from arch_plugins.init_identity import InitIdentity
from arch_plugins.interfaces import Kind, ResidualHistory, ResidualMerge, ResidualStream, ResidualType, Role, StackInfo


class StreamMixing(ResidualMerge):
    """A merge over n streams given one mixing matrix per sublayer, lucidrains' ``width_connection`` shape.

    M is (n + 1) x n (static, or one per token), indexed [row, source stream]: row 0 is what the branch reads, rows
    1..n the streams before the branch is added; b (n) is how much of the branch each stream receives. Per sublayer
    the coefficients are computed once and the streams mixed once, M H giving the branch input and the mixed
    streams together; the merge then adds b_t f. Subclasses say how M and b are made (``mixing_weights``).

    ``branch_input`` keeps (H, M H, b) for the merge of the same sublayer, which the block calls next with the same
    H: that call uses them and forgets them. A merge called on other streams (or alone) computes them again.
    """

    _pending: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def mixing_weights(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(M, b): M (n + 1, n) static or (..., n + 1, n) per token; b (n,) or (..., n)."""
        raise NotImplementedError

    def _mixed(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mixing, beta = self.mixing_weights(h)
        return mix(mixing, h), beta

    def branch_input(self, h: torch.Tensor, history: ResidualHistory) -> torch.Tensor:
        mixed, beta = self._mixed(h)
        self._pending = (h, mixed, beta)
        # A copy (one N x d pass): the sublayer keeps its input for the backward, and a view would keep the whole
        # (n + 1)-row mix alive with it, one more copy of the streams per sublayer until the backward.
        return mixed[..., 0, :].contiguous()

    def forward(self, h: torch.Tensor, branch: torch.Tensor, history: ResidualHistory) -> torch.Tensor:
        pending, self._pending = self._pending, None
        if pending is not None and pending[0] is h:
            _, mixed, beta = pending
        else:
            mixed, beta = self._mixed(h)
        return torch.addcmul(mixed[..., 1:, :], beta.to(h.dtype).unsqueeze(-1), branch.to(h.dtype).unsqueeze(-2))

    def __getstate__(self):
        # Copies and pickles never carry one forward pass's streams (a deepcopy of non-leaf tensors would fail).
        state = dict(super().__getstate__())
        state.pop("_pending", None)
        return state


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

    def _dynamic(self, h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """tanh(RMSNorm(H) W) with the reference's RMSNorm, x / max(|x|, 1e-12) * sqrt(d) * gain, folded into the
        small matmul: (H (gain * W)) * sqrt(d) / |H|. The normalised n-wide stream is never materialised."""
        inverse = math.sqrt(h.shape[-1]) / torch.linalg.vector_norm(h, dim=-1, keepdim=True).clamp_min(1e-12)
        out = (h @ (self.norm_gain.unsqueeze(-1) * weight).to(h.dtype)) * inverse
        return out.tanh() if self.tanh else out

    def mixing_weights(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """alpha transposed (the branch's read in row 0, stream s into stream t at [1 + t, s]) and beta: the
        dynamic parts of both from one norm and one matmul, h @ [W_alpha | W_beta]."""
        alpha, beta = self.static_alpha, self.static_beta
        if self.dynamic:
            dynamic = self._dynamic(h, torch.cat([self.dynamic_alpha, self.dynamic_beta.unsqueeze(-1)], dim=-1))
            alpha = alpha + dynamic[..., :-1] * self.dynamic_alpha_scale
            beta = beta + dynamic[..., -1] * self.dynamic_beta_scale
        return alpha.transpose(-1, -2), beta


def mix(mixing: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """out[..., k, :] = sum_s mixing[..., k, s] h[..., s, :], for a static (k, n) or a per-token (..., k, n) mixing.

    Autocast is off: it would run these small matmuls in bf16 and round the carried streams, which the plain
    residual keeps in float32. A static matrix is broadcast over the tokens (a stride-0 batch, never copied), so
    both cases are one batched matmul that reads the streams where they lie: einsum's lowering of the static case
    instead copies the streams into a transposed layout, and that copy was saved for backward.
    """
    with torch.autocast(device_type=h.device.type, enabled=False):
        mixing = mixing.to(h.dtype)
        if mixing.dim() == 2:
            mixing = mixing.expand(*h.shape[:-2], *mixing.shape)
        return torch.matmul(mixing, h)


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
        if self.stream_dtype == "compute" and torch.is_autocast_enabled(x.device.type):
            x = x.to(torch.get_autocast_dtype(x.device.type))
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
