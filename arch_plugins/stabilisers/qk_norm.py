"""QK-norm: each head's queries and keys normalised over head_dim before the dot product, with learned gains.

Where the references put it: per head, on the projections' outputs, before RoPE (Qwen3 and Gemma 3: an RMSNorm of
size head_dim shared by the heads; ViT-22B, which introduced it for training stability at scale, a LayerNorm
without bias). Normalising bounds the attention logits, which otherwise grow with the weights and collapse the
softmax into one-hot attention (ViT-22B, Dehghani et al. 2023; Wortsman et al. 2023).
"""

from __future__ import annotations

import torch
from torch import nn

QK_NORMS = ("rmsnorm", "layernorm")


def _norm(kind: str, head_dim: int, eps: float) -> nn.Module:
    if kind == "rmsnorm":
        return nn.RMSNorm(head_dim, eps=eps)
    return nn.LayerNorm(head_dim, eps=eps, bias=False)  # ViT-22B omits the LayerNorms' biases


class QKNorm(nn.Module):
    """(q, k) -> (norm_q(q), norm_k(k)) over head_dim, shapes (B, H, T, head_dim); q and k have their own gains."""

    def __init__(self, kind: str, head_dim: int, eps: float):
        super().__init__()
        if kind not in QK_NORMS:
            raise ValueError(f"qk_norm must be one of {', '.join(QK_NORMS)} (or null: off), got {kind!r}")
        self.q_norm, self.k_norm = _norm(kind, head_dim, eps), _norm(kind, head_dim, eps)

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # Autocast may run the norm in float32; q, k and v must share a dtype for the attention.
        return self.q_norm(q).to(q.dtype), self.k_norm(k).to(k.dtype)
