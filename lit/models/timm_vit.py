"""Load a timm ``vit_*`` state dict into our ViT (baseline plugins: layernorm, add, linear, GELU MLP).

The adapter is only a renaming: both models hold the same tensors in the same layouts (timm's fused
qkv is our fused q|k|v projection), which is what makes the ViT baseline provably the standard ViT.
"""

from __future__ import annotations

import re

import torch

# timm name -> ours; ``{i}`` is the block index.
_RENAMES = {
    "cls_token": "cls_token",
    "pos_embed": "pos_embed",
    "patch_embed.proj.{p}": "patch.{p}",
    "blocks.{i}.norm1.{p}": "stack.blocks.{i}.attn_in.{p}",
    "blocks.{i}.attn.qkv.{p}": "stack.blocks.{i}.attn.qkv.{p}",
    "blocks.{i}.attn.proj.{p}": "stack.blocks.{i}.attn.out.{p}",
    "blocks.{i}.norm2.{p}": "stack.blocks.{i}.mlp_in.{p}",
    "blocks.{i}.mlp.fc1.{p}": "stack.blocks.{i}.mlp.up.{p}",
    "blocks.{i}.mlp.fc2.{p}": "stack.blocks.{i}.mlp.down.{p}",
    "norm.{p}": "stack.final.{p}",
    "head.{p}": "head.{p}",
}


def _pattern(template: str) -> re.Pattern:
    regex = re.escape(template).replace(r"\{i\}", r"(?P<i>\d+)").replace(r"\{p\}", r"(?P<p>weight|bias)")
    return re.compile(f"^{regex}$")


_RULES = [(_pattern(src), dst) for src, dst in _RENAMES.items()]


def state_dict_from_timm(timm_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename a timm VisionTransformer state dict (cls token, no register tokens) to our ViT's names."""
    ours = {}
    for name, tensor in timm_state.items():
        for pattern, dst in _RULES:
            match = pattern.match(name)
            if match:
                ours[dst.format(**match.groupdict())] = tensor
                break
        else:
            raise KeyError(f"no counterpart for timm tensor {name!r} (only the standard cls-token ViT is supported)")
    return ours
