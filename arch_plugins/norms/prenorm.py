"""Pre-norm: normalise each sublayer's input and the stack's output (GPT-2, LLaMA, ViT)."""

from __future__ import annotations

from torch import nn

from arch_plugins.interfaces import NormStrategy, Site, StackInfo


class PreNorm(NormStrategy):
    """Pre-norm with a norm layer chosen by subclasses: ``h = h + f(norm(h))``, final norm before the head."""

    SITES = (Site.ATTN_IN, Site.MLP_IN, Site.FINAL)

    def make_norm(self, dim: int) -> nn.Module:
        raise NotImplementedError

    def site(self, site: str, dim: int, layer: int | None, stack: StackInfo) -> nn.Module | None:
        return self.make_norm(dim) if site in self.SITES else None


class LayerNormStrategy(PreNorm):
    """Pre-norm with LayerNorm (mean-centred, variance-scaled; GPT-2 and ViT)."""

    def __init__(self, eps: float = 1e-5, affine: bool = True, bias: bool = True):
        self.eps, self.affine, self.bias = eps, affine, bias

    def make_norm(self, dim: int) -> nn.Module:
        return nn.LayerNorm(dim, eps=self.eps, elementwise_affine=self.affine, bias=self.bias and self.affine)


class RMSNormStrategy(PreNorm):
    """Pre-norm with RMSNorm (scale only, no centring; LLaMA)."""

    def __init__(self, eps: float = 1e-6, affine: bool = True):
        self.eps, self.affine = eps, affine

    def make_norm(self, dim: int) -> nn.Module:
        return nn.RMSNorm(dim, eps=self.eps, elementwise_affine=self.affine)


class LayerNormNonParamStrategy(PreNorm):
    """TokenFormer's norms: pre-norm LayerNorm without weight or bias in the blocks, affine before the head.

    The paper's ablation found the blocks' learnable LayerNorm parameters unnecessary (82.6 vs 82.5
    top-1 on ImageNet); the final norm keeps them because it feeds the head.
    """

    def __init__(self, eps: float = 1e-5):
        self.eps = eps

    def site(self, site: str, dim: int, layer: int | None, stack: StackInfo) -> nn.Module | None:
        if site not in self.SITES:
            return None
        return nn.LayerNorm(dim, eps=self.eps, elementwise_affine=site == Site.FINAL)


# The norm layers that the placement strategies (post-norm, Peri-LN, Mix-LN, LayerNorm-Scaling) put
# wherever they put norms: a researcher compares placements with the layer kept fixed.
BASE_NORMS: dict[str, type[PreNorm]] = {"layernorm": LayerNormStrategy, "rmsnorm": RMSNormStrategy}


def base_norm(base: str, eps: float | None = None) -> PreNorm:
    """The ``layernorm`` or ``rmsnorm`` strategy whose ``make_norm`` a placement strategy builds on.

    ``eps`` None keeps that norm's own default (1e-5 for LayerNorm, 1e-6 for RMSNorm).
    """
    if base not in BASE_NORMS:
        raise ValueError(f"base must be one of {', '.join(BASE_NORMS)}, got {base!r}")
    return BASE_NORMS[base]() if eps is None else BASE_NORMS[base](eps=eps)
