"""Rotary position embedding (Su et al.), the rotate-half layout of GPT-NeoX and LLaMA.

Each pair (x_i, x_{i+d/2}) is rotated by angle pos * base^(-2i/d): a true rotation, so norms are kept
and q_m . k_n depends only on m - n (tests check both; nGPT's reference code gets this wrong).
"""

from __future__ import annotations

import torch
from torch import nn


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, max_len: int, base: float = 10000.0):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"RoPE needs an even head dimension, got {head_dim}")
        inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        angles = torch.outer(torch.arange(max_len, dtype=torch.float64), inv_freq)  # (T, d/2)
        angles = torch.cat([angles, angles], dim=-1)
        # Not persistent: derived from the config, so checkpoints stay independent of max_len.
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, H, T, head_dim), positions 0..T-1."""
        T = x.shape[-2]
        cos, sin = self.cos[:T].to(x.dtype), self.sin[:T].to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin
