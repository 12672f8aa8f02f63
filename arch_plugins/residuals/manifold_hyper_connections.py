"""Manifold-constrained hyper-connections (mHC; Xie et al., DeepSeek-AI, arXiv 2512.24880): hyper-connections whose
stream-mixing matrix is projected onto the doubly stochastic matrices, so the stream keeps its scale with depth.

The stream is n copies wide, (..., n, d), as in hyper-connections. Around each sublayer f, from the n streams x
flattened to one vector of n*d::

    r          = 1 / (RMS(vec x) + eps_norm)                    no gain: it folds into phi
    H~_pre     = alpha_pre  * r (vec x) phi_pre  + b_pre          (n)
    H~_post    = alpha_post * r (vec x) phi_post + b_post         (n)
    H~_res     = alpha_res  * r mat((vec x) phi_res) + b_res      (n x n)
    H_pre      = sigmoid(H~_pre)         H_post = 2 sigmoid(H~_post)         H_res = SinkhornKnopp(H~_res)
    x_{l+1}    = H_res x_l + H_post^T f(H_pre x_l)

Sinkhorn-Knopp starts from exp(H~_res) and alternates a row and a column normalisation, 20 times: H_res is then
doubly stochastic (non-negative, rows and columns summing to 1) up to the last row step, so its spectral norm is
at most 1 and a product of them over any depth stays doubly stochastic: the composite residual map neither
amplifies nor shrinks the stream (the paper's fix for hyper-connections' composite gains of ~3000 at 27B).

Init as NVIDIA Megatron-LM's implementation of the paper (megatron/core/transformer/hyper_connection.py): phi
Xavier-uniform, alpha = 0.01 (the paper's gating-factor init), b = 0. So at init H_pre ~ 1/2, H_post ~ 1 and
H_res ~ J/n (the uniform average): the n streams stay copies of one stream, each sublayer reads n/2 times it (a
pre-norm removes the factor) and adds its output once. The embedding is repeated into the n streams before the
first block and the streams are averaged after the last (Megatron's ``output_contract``), so with alpha = 0 and
pre-norm sublayers the stack computes exactly what the plain residual does.

Differences from the references, on purpose: the coefficients and the mixing run in float32 with autocast off (the
mixing in the streams' dtype, bf16 under ``stream_dtype="compute"``), as both references keep them (Megatron's
``mark_keep_in_fp32``, DeepSeek-V4's fp32 HC modules). DeepSeek-V4's production variant (its Hugging Face port,
``DeepseekV4HyperConnection``) adds 1e-6 to H_pre, starts Sinkhorn from a row softmax and puts 1e-6 in every
denominator, and ends with a learned sigmoid-weighted sum of the streams: the paper's form is built here; the two
Sinkhorn orders converge to the same doubly stochastic limit (a test checks they agree within 1e-5 after 20
iterations).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from arch_plugins.autocast import autocast_off
from arch_plugins.declarations import declare_diagnostic, declare_role, declare_roles, declare_weight_decay
from arch_plugins.interfaces import Kind, Role, StackInfo
from arch_plugins.kernels.dispatch import SINKHORN_KNOPP, check_kernel, use_triton
from arch_plugins.residuals.hyper_connections import MultiStreamResidual, StreamMixing, mix, mix_grad
from arch_plugins.residuals.sinkhorn import sinkhorn_knopp, sinkhorn_knopp_backward  # noqa: F401  (re-exported)


def _res_diagonal(module: ManifoldConstrainedConnection) -> torch.Tensor:
    """The static part's self-weight: how much each stream keeps of itself when the input-dependent part is off."""
    n = module.streams
    return sinkhorn_knopp(module.bias[2 * n:].float().view(n, n), module.sinkhorn_iters).diagonal().mean()


class ManifoldConstrainedConnection(StreamMixing):
    """One sublayer's mHC: H_pre reads the streams, H_post writes the output back, H_res mixes the streams."""

    def __init__(self, dim: int, streams: int, *, sinkhorn_iters: int, gating_init: float, norm_eps: float,
                 kernel: str = "auto"):
        super().__init__()
        n = streams
        self.streams, self.sinkhorn_iters, self.norm_eps, self.kernel = n, sinkhorn_iters, norm_eps, kernel
        # One projection for the three maps, rows [pre (n) | post (n) | res (n * n)], as both references lay it out.
        self.phi = nn.Parameter(torch.empty(n * n + 2 * n, n * dim))
        nn.init.xavier_uniform_(self.phi)
        self.alpha_pre = nn.Parameter(torch.tensor(float(gating_init)))
        self.alpha_post = nn.Parameter(torch.tensor(float(gating_init)))
        self.alpha_res = nn.Parameter(torch.tensor(float(gating_init)))
        self.bias = nn.Parameter(torch.zeros(n * n + 2 * n))
        # phi maps the width to a handful of coefficients (a readout, like hyper-connections' dynamic alpha; its
        # Xavier init is already over sqrt(fan-in)); it decays as the matrix it is, as before roles existed.
        declare_role(self, "phi", "mhc_projection", kind=Kind.READOUT, group="residual", init="fan_in")
        declare_weight_decay(self, "phi", True)
        declare_roles(self, {name: "mhc_gate" for name in ("alpha_pre", "alpha_post", "alpha_res")}, kind=Kind.SCALAR,
                      group="residual")
        declare_role(self, "bias", Role.BIAS, group="residual")
        for name in ("alpha_pre", "alpha_post", "alpha_res"):
            declare_diagnostic(self, name)
        declare_diagnostic(self, "res_diagonal", _res_diagonal)

    def coefficients(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(H_pre (..., n), H_post (..., n), H_res (..., n, n), indexed [target, source]) for streams (..., n, d),
        from one norm and one projection of the streams, in float32 (differentiable as autograd ops; the merge
        runs the same forward inside one node, ``_Connection``)."""
        lead, n = h.shape[:-2], self.streams
        parts = _coefficients(h.reshape(-1, n, h.shape[-1]), self.phi, self.alpha_pre, self.alpha_post,
                              self.alpha_res, self.bias, self.sinkhorn_iters, self.norm_eps, self.kernel)
        pre, post_sigmoid, res = parts[-3], parts[-2], parts[-1]
        return pre.reshape(*lead, n), (2 * post_sigmoid).reshape(*lead, n), res.reshape(*lead, n, n)

    def connect(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return _Connection.apply(h, self.phi, self.alpha_pre, self.alpha_post, self.alpha_res, self.bias,
                                 self.sinkhorn_iters, self.norm_eps, self.kernel)


SINKHORN_EPS = 1e-6  # Sinkhorn's sums floored there, as Megatron-LM does (residuals/sinkhorn.py's default)


def _coefficients(streams, phi, alpha_pre, alpha_post, alpha_res, bias, iters: int, norm_eps: float, kernel: str):
    """The coefficients' forward for (N, n, d) streams, in float32 with autocast off: (flattened streams, |x|,
    1 / (RMS + eps), gates, projection, projection / (RMS + eps), Sinkhorn's logits, whether it ran fused, H_pre,
    sigmoid of H~_post, H_res), everything ``_Connection``'s backward reads."""
    n = streams.shape[-2]
    with autocast_off(streams.device.type):
        flat = streams.float().reshape(streams.shape[0], -1)
        norm = torch.linalg.vector_norm(flat, dim=-1, keepdim=True)
        inverse = torch.reciprocal(norm / flat.shape[-1] ** 0.5 + norm_eps)
        gates = torch.cat([alpha_pre.expand(n), alpha_post.expand(n), alpha_res.expand(n * n)]).float()
        projection = flat @ phi.float().t()
        scaled = projection * inverse
        h_tilde = scaled * gates + bias.float()
        pre_act, post_act, res_act = h_tilde.split([n, n, n * n], dim=-1)
        logits = res_act.unflatten(-1, (n, n))
        fused = use_triton(kernel, SINKHORN_KNOPP, logits)
        if fused:
            from arch_plugins.kernels.sinkhorn_knopp import sinkhorn_knopp as fused_sinkhorn_knopp

            res = fused_sinkhorn_knopp(logits, iters, SINKHORN_EPS)
        else:
            res = sinkhorn_knopp(logits, iters, SINKHORN_EPS)
        return (flat, norm, inverse, gates, projection, scaled, logits, fused, pre_act.sigmoid(), post_act.sigmoid(),
                res)


class _Connection(torch.autograd.Function):
    """mHC's coefficients and mix as one autograd node: the forward of ``_coefficients`` and ``mix`` with
    M = [H_pre; H_res]; the backward autograd's for the same ops, written out (Sinkhorn's by its own backward,
    fused or torch, as its autograd would call it). The mix in the streams' dtype, the rest in float32."""

    @staticmethod
    def forward(ctx, h, phi, alpha_pre, alpha_post, alpha_res, bias, iters: int, norm_eps: float, kernel: str):
        lead, (n, d) = h.shape[:-2], h.shape[-2:]
        streams = h.reshape(-1, n, d)
        flat, norm, inverse, gates, projection, scaled, logits, fused, pre, post_sigmoid, res = _coefficients(
            streams, phi, alpha_pre, alpha_post, alpha_res, bias, iters, norm_eps, kernel)
        with autocast_off(h.device.type):
            rows = torch.cat([pre.unsqueeze(-2), res], dim=-2).to(h.dtype)
            branch, mixed = mix(rows, streams, lead)
            post = 2 * post_sigmoid
        ctx.iters, ctx.fused = iters, fused
        ctx.dtypes = (h.dtype, phi.dtype, alpha_pre.dtype, alpha_post.dtype, alpha_res.dtype, bias.dtype)
        ctx.save_for_backward(streams, flat, phi, norm, inverse, gates, projection, scaled, logits, pre, post_sigmoid,
                              rows)
        return branch, mixed, post.view(*lead, n, 1)

    @staticmethod
    @once_differentiable
    def backward(ctx, g_branch, g_mixed, g_post):
        (streams, flat, phi, norm, inverse, gates, projection, scaled, logits, pre, post_sigmoid,
         rows) = ctx.saved_tensors
        h_dtype, phi_dtype, pre_dtype, post_dtype, res_dtype, bias_dtype = ctx.dtypes
        n = streams.shape[-2]
        g_out = mix_grad(g_branch, g_mixed, streams)
        g_rows = torch.bmm(g_out, streams.transpose(1, 2)).float()
        if ctx.fused:
            from arch_plugins.kernels.sinkhorn_knopp import sinkhorn_knopp_backward as fused_sinkhorn_knopp_backward

            g_logits = fused_sinkhorn_knopp_backward(logits, g_rows[:, 1:], ctx.iters, SINKHORN_EPS)
        else:
            g_logits = sinkhorn_knopp_backward(logits, g_rows[:, 1:], ctx.iters, SINKHORN_EPS)
        g_h_tilde = torch.cat([torch.ops.aten.sigmoid_backward(g_rows[:, 0], pre),
                               torch.ops.aten.sigmoid_backward(2 * g_post.reshape(-1, n), post_sigmoid),
                               g_logits.reshape(-1, n * n)], dim=-1)
        g_scaled = g_h_tilde * gates
        g_projection = g_scaled * inverse
        g_gate_pre, g_gate_post, g_gate_res = (g_h_tilde * scaled).sum(0).split([n, n, n * n])
        # inverse = 1 / (|x| / sqrt(nd) + eps), so d inverse / d|x| = -inverse^2 / sqrt(nd); d|x|/dx = x / |x|, zero
        # at x = 0 as the norm's own backward has it.
        g_inverse = (g_scaled * projection).sum(-1, keepdim=True)
        through_norm = (g_inverse * (inverse * inverse) / norm).masked_fill_(norm == 0, 0)
        g_flat = torch.addcmul(g_projection @ phi.float(), through_norm, flat, value=-1 / flat.shape[-1] ** 0.5)
        g_h = torch.baddbmm(g_flat.view(streams.shape).to(h_dtype), rows.transpose(1, 2), g_out)
        return (g_h.view(g_mixed.shape), (g_projection.t() @ flat).to(phi_dtype), g_gate_pre.sum().to(pre_dtype),
                g_gate_post.sum().to(post_dtype), g_gate_res.sum().to(res_dtype), g_h_tilde.sum(0).to(bias_dtype),
                None, None, None)


class ManifoldConstrainedHyperConnections(MultiStreamResidual):
    """mHC: n residual streams mixed per sublayer by a doubly stochastic (Sinkhorn-projected) matrix.

    Args:
        streams: n, the expansion rate (the paper uses 4).
        sinkhorn_iters: t_max, the Sinkhorn-Knopp iterations (the paper's 20).
        gating_init: initial alpha_pre, alpha_post, alpha_res, the gates of the input-dependent part (the paper's
            0.01); 0 starts as the plain residual (with pre-norm sublayers).
        norm_eps: added to the RMS of the flattened streams (Megatron-LM's 1e-6).
        stream_dtype: "float32" (default) or "compute": the streams in autocast's dtype while autocast is on (the
            coefficients stay float32, as DeepSeek keeps them).
        kernel: Sinkhorn-Knopp as the fused Triton op (``triton``), the torch ops (``torch``), or ``auto``: Triton
            only on a GPU where it was measured faster (arch_plugins.kernels; none yet).
    """

    reduce = "mean"

    def __init__(self, streams: int = 4, sinkhorn_iters: int = 20, gating_init: float = 0.01, norm_eps: float = 1e-6,
                 stream_dtype: str = "float32", kernel: str = "auto"):
        super().__init__(streams, stream_dtype)
        if not isinstance(sinkhorn_iters, int) or isinstance(sinkhorn_iters, bool) or sinkhorn_iters < 1:
            raise ValueError(f"sinkhorn_iters is the number of Sinkhorn-Knopp iterations (the paper uses 20); give an "
                             f"integer >= 1, got {sinkhorn_iters!r}")
        self.sinkhorn_iters, self.gating_init, self.norm_eps = sinkhorn_iters, gating_init, norm_eps
        self.kernel = check_kernel(kernel)

    def merge(self, sublayer: str, layer: int, stack: StackInfo) -> ManifoldConstrainedConnection:
        return ManifoldConstrainedConnection(stack.d_model, self.streams, sinkhorn_iters=self.sinkhorn_iters,
                                             gating_init=self.gating_init, norm_eps=self.norm_eps, kernel=self.kernel)
