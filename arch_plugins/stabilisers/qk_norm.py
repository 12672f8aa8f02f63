"""QK-norm: each head's queries and keys normalised over head_dim before the dot product, with learned gains.

Where the references put it: per head, on the projections' outputs, before RoPE (Qwen3 and Gemma 3: an RMSNorm of
size head_dim shared by the heads; ViT-22B, which introduced it for training stability at scale, a LayerNorm
without bias). Normalising bounds the attention logits, which otherwise grow with the weights and collapse the
softmax into one-hot attention (ViT-22B, Dehghani et al. 2023; Wortsman et al. 2023).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from arch_plugins.autocast import autocast_off

QK_NORMS = ("rmsnorm", "layernorm")


def _norm(kind: str, head_dim: int, eps: float) -> nn.Module:
    if kind == "rmsnorm":
        return nn.RMSNorm(head_dim, eps=eps)
    return nn.LayerNorm(head_dim, eps=eps, bias=False)  # ViT-22B omits the LayerNorms' biases


class QKNorm(nn.Module):
    """(q, k) -> (norm_q(q), norm_k(k)) over head_dim, shapes (B, H, T, head_dim); q and k have their own gains.

    The norm runs in q's and k's own dtype, its gains cast to it, outside autocast. Under bf16 autocast the
    obvious ``nn.RMSNorm(q)`` with float32 gains is run in float32 (CUDA's autocast lists rms_norm and layer_norm
    as float32 ops, and mixed dtypes miss the fused kernel), hands back float32, and is cast back to bf16 for the
    attention: two casts and an fp32 (B, H, T, head_dim) tensor per tensor and layer. Here the fused kernel still
    reduces in float32 inside; what changes is that the gains are rounded to bf16 before they multiply, as in a
    bf16 Qwen3 or Gemma 3 (whose norm weights are bf16). In float32 nothing changes at all.
    """

    def __init__(self, kind: str, head_dim: int, eps: float):
        super().__init__()
        if kind not in QK_NORMS:
            raise ValueError(f"qk_norm must be one of {', '.join(QK_NORMS)} (or null: off), got {kind!r}")
        self.q_norm, self.k_norm = _norm(kind, head_dim, eps), _norm(kind, head_dim, eps)

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with autocast_off(q.device.type):
            return _in_own_dtype(self.q_norm, q), _in_own_dtype(self.k_norm, k)


def _in_own_dtype(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``norm(x)`` with the norm's gains cast to x's dtype (its eps given, never dtype-dependent)."""
    weight = norm.weight.to(x.dtype)
    if isinstance(norm, nn.RMSNorm):
        return F.rms_norm(x, norm.normalized_shape, weight, norm.eps)
    return F.layer_norm(x, norm.normalized_shape, weight, None, norm.eps)
