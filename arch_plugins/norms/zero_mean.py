"""Pre-RMSNorm and Pre-CRMSNorm (Jiang, Gu, Zhu, Pan; NeurIPS 2023; code ZixuanJiang/pre-rmsnorm-transformer).

For a zero-mean vector LayerNorm and RMSNorm coincide (the variance is the mean square). A Pre-LN
Transformer whose main branch is kept zero-mean can therefore use RMSNorm (Pre-RMSNorm), and since a
zero-mean d-vector is fixed by any d-1 of its coordinates, RMSNorm of it can be computed from d-1 of them
(CRMSNorm). Both are exact re-parametrisations of Pre-LN: ``cli.py convert-norm`` turns a trained
``layernorm`` checkpoint into either, with equal logits.

How this project keeps the main branch zero-mean during training: everything that writes to the stream
is centred at the norm strategy's sites (the embedding site, and each sublayer's output site). The
reference centres the embedding the same way (``h - h.mean(-1)``, ``torch/model.py``) and the output
projections through their weights (``LinearZeroMeanOutput``: ``W - W.mean(0)``, ``b - b.mean()``).
Centring a linear map's output is that same map with centred weights, so the function and the gradients
are the reference's; the cost differs (a mean over d per token instead of one per weight matrix), and it
works for any projection type, not only dense ones.

Pre-CRMSNorm here keeps the stream d wide and reads its first d-1 coordinates: the last one is implied
(minus the sum of the others) and never read, which is the reference's (d-1)-wide model in a d-wide
tensor. The reference's model is physically d-1 wide; this stack has one width for the stream and the
sublayers, so the saving of one coordinate (under 1% of the work at d = 128) is not realised.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from arch_plugins.declarations import declare_roles
from arch_plugins.interfaces import NormStrategy, Role, Site, StackInfo

NORM_SITES = (Site.ATTN_IN, Site.MLP_IN, Site.FINAL)
# Everything that writes to the residual stream: the embedding and each sublayer's output.
WRITER_SITES = (Site.EMBEDDING, Site.ATTN_OUT, Site.MLP_OUT)


class MeanCentring(nn.Module):
    """x - mean(x) over the last dim: keeps what is written to the stream zero-mean."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x - x.mean(dim=-1, keepdim=True)


class _Affine(nn.Module):
    """An optional per-channel gain and bias after the normalisation (LayerNorm's, carried over by conversion)."""

    def __init__(self, dim: int, eps: float, affine: bool):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if affine else None
        self.bias = nn.Parameter(torch.zeros(dim)) if affine else None
        declare_roles(self, {"weight": Role.GAIN, "bias": Role.BIAS})

    def affine(self, y: torch.Tensor) -> torch.Tensor:
        return y if self.weight is None else y * self.weight + self.bias

    def extra_repr(self) -> str:
        return f"eps={self.eps:g}, affine={self.weight is not None}"


class ZeroMeanRMSNorm(_Affine):
    """RMSNorm of an input that the strategy keeps zero-mean: ``x * rsqrt(mean(x^2) + eps)`` (= LayerNorm there)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The fused native RMSNorm: the same x * rsqrt(mean(x^2) + eps), one kernel each way on CUDA.
        y = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return self.affine(y.type_as(x))


class CRMSNorm(_Affine):
    """Compressed RMSNorm: reads the first d-1 coordinates x of the stream, the d-th being -sum(x).

    ``n = x / sqrt((sum(x^2) + sum(x)^2) / d + eps)`` (the reference's ``crms_norm``), returned as the full
    d-vector ``[n, -sum(n)]``, which is LayerNorm of the zero-mean vector those coordinates stand for.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # [kept, -sum(kept)] has mean square (sum(kept^2) + sum(kept)^2) / d, so the fused native RMSNorm of it is
        # the formula above: the vector is built once (one sum, one cat) and normalised in one kernel each way.
        kept = x[..., :-1].float()
        full = torch.cat([kept, -kept.sum(dim=-1, keepdim=True)], dim=-1)
        y = F.rms_norm(full, (x.shape[-1],), eps=self.eps)
        return self.affine(y.type_as(x))


class PreRMSNormStrategy(NormStrategy):
    """Pre-RMSNorm: Pre-LN's function with RMSNorm, the main branch kept zero-mean (Jiang et al. 2023).

    Args:
        eps: the RMSNorm epsilon (1e-5: the reference's RMSNorm subclasses nn.LayerNorm and keeps its default;
            a converted checkpoint takes its LayerNorm's).
        affine: a gain and bias after each RMSNorm. The reference has none (its norms are
            ``elementwise_affine=False``, and conversion folds LayerNorm's into the next linear); a converted
            checkpoint keeps LayerNorm's here instead, which needs no new bias in the next projection (the
            GPT head has none).
    """

    def __init__(self, eps: float = 1e-5, affine: bool = False):
        self.eps, self.affine = eps, affine

    def site(self, site: str, dim: int, layer: int | None, stack: StackInfo) -> nn.Module | None:
        if site in NORM_SITES:
            return ZeroMeanRMSNorm(dim, self.eps, self.affine)
        if site in WRITER_SITES:
            return MeanCentring()
        return None


class PreCRMSNormStrategy(NormStrategy):
    """Pre-CRMSNorm: Pre-LN's function with RMSNorm computed from d-1 coordinates (Jiang et al. 2023).

    Nothing needs centring: only the first d-1 coordinates of the stream are read, and any d-1 numbers are
    the coordinates of one zero-mean d-vector.

    Args:
        eps: the CRMSNorm epsilon (see ``prermsnorm``).
        affine: a gain and bias after each CRMSNorm (see ``prermsnorm``).
    """

    def __init__(self, eps: float = 1e-5, affine: bool = False):
        self.eps, self.affine = eps, affine

    def site(self, site: str, dim: int, layer: int | None, stack: StackInfo) -> nn.Module | None:
        if site in NORM_SITES:
            return CRMSNorm(dim, self.eps, self.affine)
        return None
