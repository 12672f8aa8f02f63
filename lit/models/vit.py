"""ViT: patch embedding + the shared transformer stack (bidirectional) + classification head.

With the baseline plugins (layernorm eps 1e-6, add, linear, GELU MLP with biases, cls token, learned
positions) this is timm's VisionTransformer, weight for weight (tests/test_vit.py checks the logits).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import torch
from torch import nn

from arch_plugins.declarations import declare_roles, declare_weight_decay
from arch_plugins.interfaces import Role, Site
from lit.errors import ArchitectureError
from lit.models.transformer import TransformerConfig, TransformerStack

# The standard sizes (Dosovitskiy et al.; DeiT): (d_model, n_layers, n_heads); the MLP is 4 d_model.
VIT_VARIANTS: dict[str, tuple[int, int, int]] = {
    "tiny": (192, 12, 3),
    "small": (384, 12, 6),
    "base": (768, 12, 12),
    "large": (1024, 24, 16),
}

# The ViT defaults: bias everywhere and a GELU MLP as in timm; positions are the ViT's own.
VIT_ARCH = TransformerConfig(d_model=192, n_layers=12, n_heads=3, mlp="gelu", bias=True, positions="none",
                             norm="layernorm", norm_options={"eps": 1e-6}, depth_scaled_init=False)


def with_variant(arch: TransformerConfig, variant: str | None) -> TransformerConfig:
    """``arch`` with the width, depth and heads of a standard ViT size (plugins and options kept)."""
    if variant is None:
        return arch
    if variant not in VIT_VARIANTS:
        raise ArchitectureError(f"unknown ViT variant {variant!r}; choose one of {', '.join(VIT_VARIANTS)}")
    d, layers, heads = VIT_VARIANTS[variant]
    return dataclasses.replace(arch, d_model=d, n_layers=layers, n_heads=heads, mlp_hidden=None)


def sincos_2d(grid: int, dim: int) -> torch.Tensor:
    """Fixed 2-D sine-cosine positions (MAE): a quarter of the channels each for sin/cos of row and column."""
    if dim % 4:
        raise ArchitectureError(f"sin-cos positions need d_model divisible by 4, got {dim}; change d_model or use "
                                f"pos_embed learned")
    omega = 1.0 / 10000 ** (torch.arange(dim // 4, dtype=torch.float64) / (dim // 4))
    rows, cols = torch.meshgrid(torch.arange(grid, dtype=torch.float64), torch.arange(grid, dtype=torch.float64),
                                indexing="ij")
    angles_c, angles_r = cols.reshape(-1, 1) * omega, rows.reshape(-1, 1) * omega
    return torch.cat([angles_c.sin(), angles_c.cos(), angles_r.sin(), angles_r.cos()], dim=1).float()


class ViT(nn.Module):
    def __init__(self, num_classes: int, image_size: int, patch_size: int, in_chans: int, arch: TransformerConfig,
                 pooling: Literal["cls", "mean"] = "cls", pos_embed: Literal["learned", "sincos", "none"] = "learned"):
        super().__init__()
        if image_size % patch_size:
            raise ArchitectureError(f"image_size={image_size} is not a multiple of patch_size={patch_size}; choose a "
                                    f"patch_size that divides it")
        if arch.positions == "learned":
            raise ArchitectureError("a ViT's positions are set by pos_embed; set arch.positions to none (or rope)")
        d, grid = arch.d_model, image_size // patch_size
        self.pooling = pooling
        self.patch = nn.Conv2d(in_chans, d, patch_size, stride=patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d)) if pooling == "cls" else None
        n_tokens = grid * grid + (self.cls_token is not None)
        if pos_embed == "learned":
            self.pos_embed = nn.Parameter(torch.randn(1, n_tokens, d) * 0.02)
        elif pos_embed == "sincos":
            table = sincos_2d(grid, d)
            if self.cls_token is not None:  # the cls token has no position (zeros), as in MAE
                table = torch.cat([torch.zeros(1, d), table])
            self.register_buffer("pos_embed", table.unsqueeze(0), persistent=False)
        else:
            self.pos_embed = None
        self.stack = TransformerStack(arch, causal=False, max_len=n_tokens)
        self.head = nn.Linear(d, num_classes)
        nn.init.normal_(self.head.weight, std=arch.init_std)
        nn.init.zeros_(self.head.bias)
        self.logits = self.stack.site(Site.LOGITS, num_classes)
        declare_roles(self.patch, {"weight": Role.EMBEDDING, "bias": Role.BIAS})
        declare_roles(self, {"cls_token": Role.CLS_TOKEN, "pos_embed": Role.POSITION})  # a sincos table is a buffer
        # Neither decays, as in timm (``VisionTransformer.no_weight_decay``), DeiT, MAE and mmpretrain: decay would
        # pull the class token and the positions towards zero, which is no prior for either.
        for name in ("cls_token", "pos_embed"):
            if isinstance(getattr(self, name), nn.Parameter):
                declare_weight_decay(self, name, False)
        declare_roles(self.head, {"weight": Role.HEAD, "bias": Role.BIAS})
        # The patch embedding writes d_model vectors (like a token embedding: dim 0 of the conv weight);
        # the head reads them (dim 1).
        self.stack.constrain(self.patch, Role.EMBEDDING, dim=0)
        self.stack.constrain(self.head, Role.HEAD, dim=1)
        self.readout_multiplier = self.stack.output_multiplier
        self.stack.parametrize(self)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """images (B, C, H, W) -> logits (B, num_classes)."""
        x = self.patch(images).flatten(2).transpose(1, 2)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        if self.pos_embed is not None:
            x = x + self.pos_embed
        x = self.stack(x)
        pooled = x[:, 0] if self.pooling == "cls" else x.mean(dim=1)
        if self.readout_multiplier is not None:
            pooled = pooled * self.readout_multiplier
        return self.logits(self.head(pooled))
