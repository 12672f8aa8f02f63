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

from arch_plugins.declarations import declare_diagnostic, declare_role, declare_roles, declare_weight_decay
from arch_plugins.interfaces import Kind, Role, StackInfo
from arch_plugins.kernels.dispatch import SINKHORN_KNOPP, check_kernel, use_triton
from arch_plugins.residuals.hyper_connections import MultiStreamResidual, StreamMixing
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
        from one norm and one projection of the streams, in float32."""
        n = self.streams
        with torch.autocast(device_type=h.device.type, enabled=False):
            flat = h.float().flatten(-2)
            inverse_rms = 1.0 / (flat.norm(dim=-1, keepdim=True) / flat.shape[-1] ** 0.5 + self.norm_eps)
            gates = torch.cat([self.alpha_pre.expand(n), self.alpha_post.expand(n), self.alpha_res.expand(n * n)])
            h_tilde = (flat @ self.phi.float().t()) * inverse_rms * gates.float() + self.bias.float()
            pre = torch.sigmoid(h_tilde[..., :n])
            post = 2 * torch.sigmoid(h_tilde[..., n:2 * n])
            res_logits = h_tilde[..., 2 * n:].unflatten(-1, (n, n))
            if use_triton(self.kernel, SINKHORN_KNOPP, res_logits):
                from arch_plugins.kernels.sinkhorn_knopp import sinkhorn_knopp as fused_sinkhorn_knopp

                res = fused_sinkhorn_knopp(res_logits, self.sinkhorn_iters)
            else:
                res = sinkhorn_knopp(res_logits, self.sinkhorn_iters)
        return pre, post, res

    def mixing_weights(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # Row 0 H_pre, what the branch reads; rows 1..n H_res, already [target, source] as StreamMixing's rows.
        pre, post, res = self.coefficients(h)
        return torch.cat([pre.unsqueeze(-2), res], dim=-2), post


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
