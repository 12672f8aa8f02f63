"""Fold norms that are affine maps at inference into the linear layer that reads them.

A site module that computes ``x @ A.T + b`` at inference says so with ``inference_affine() -> (A, b)``
(``A`` a vector for a per-channel scale, or a (d, d) matrix): PRepBN's RepBN with its running statistics
(SLAB's ``merge_bn``), the LayerNorm-free model's centred affine maps. Folding sets the next linear to
``W A`` and ``W b + c`` and the site to the identity, so the model computes the same logits with no
normalisation left. This is an inference transformation: the folded model is not built from a config.
"""

from __future__ import annotations

import torch
from torch import nn

from lit.errors import UserInputError


def _fold_into(linear: nn.Module, site: nn.Module, what: str) -> None:
    if not isinstance(linear, nn.Linear):
        raise UserInputError(f"cannot fold the norm at {what} into {type(linear).__name__}: folding needs a dense "
                             f"linear layer after the norm (projection: linear)")
    a, b = (t.detach().float() for t in site.inference_affine())
    w = linear.weight.detach().float()
    new_w = w * a if a.dim() == 1 else w @ a
    shift = w @ b
    if linear.bias is not None:
        shift = shift + linear.bias.detach().float()
    # New tensors, not in-place: a head tied to the embedding must stop sharing it once scaled.
    linear.weight = nn.Parameter(new_w.to(linear.weight.dtype))
    linear.bias = nn.Parameter(shift.to(linear.weight.dtype))


@torch.no_grad()
def fold_affine_norms(model: nn.Module) -> int:
    """Fold every foldable pre-norm site of a GPT or ViT (``model.stack``, ``model.head``) in place; returns how
    many. Sites without ``inference_affine`` are left alone. Call on a model in eval mode."""
    if model.training:
        raise ValueError("fold a model in eval mode: the folded map is its inference behaviour")
    count = 0
    for i, block in enumerate(model.stack.blocks):
        for site_name, target, what in (("attn_in", lambda b: b.attn.qkv, "attn_in"),
                                        ("mlp_in", lambda b: getattr(b.mlp, "up", b.mlp), "mlp_in")):
            site = getattr(block, site_name)
            if hasattr(site, "inference_affine"):
                _fold_into(target(block), site, f"block {i} {what}")
                setattr(block, site_name, nn.Identity())
                count += 1
    if hasattr(model.stack.final, "inference_affine"):
        # ViT pools (the cls token or a mean over tokens) between the final site and the head: both are linear
        # and commute with a per-token affine map.
        _fold_into(model.head, model.stack.final, "final")
        model.stack.final = nn.Identity()
        count += 1
    return count
