"""Rotary position embedding (Su et al.), the rotate-half layout of GPT-NeoX and LLaMA.

Each pair (x_i, x_{i+d/2}) is rotated by angle pos * base^(-2i/d): a true rotation, so norms are kept
and q_m . k_n depends only on m - n (tests check both; nGPT's reference code gets this wrong).

Partial rotary (GPT-NeoX's ``rotary_pct``, which TokenFormer's configs set to 0.25): only the first
r = int(pct * head_dim) dims of each head are rotated, as a RoPE of dimension r (frequencies base^(-2i/r),
pairs (x_i, x_{i+r/2})); the other dims pass through unchanged (Haiyang-W/TokenFormer
megatron/model/tokenformer.py:255-264, 447-455). pct = 1 is the full RoPE above, computed as before.
"""

from __future__ import annotations

import torch
from torch import nn

from lit.errors import ArchitectureError


def rotary_dims(head_dim: int, pct: float) -> int:
    """How many leading dims of a head RoPE rotates: int(pct * head_dim), which must be even and positive."""
    if not 0 < pct <= 1:
        raise ArchitectureError(f"rope_pct is the fraction of each head that RoPE rotates, in (0, 1], got {pct}")
    dims = int(head_dim * pct)
    if dims < 2 or dims % 2:
        raise ArchitectureError(f"rope_pct={pct} rotates {dims} of the {head_dim} dims of each head; RoPE needs an "
                                f"even number of at least 2: choose rope_pct so that rope_pct * head_dim is even")
    return dims


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, max_len: int, base: float = 10000.0, pct: float = 1.0):
        super().__init__()
        if head_dim % 2:
            raise ArchitectureError(f"RoPE needs an even head width (d_model / n_heads), got {head_dim}; change "
                                    f"d_model or n_heads, or set arch.positions to learned or none")
        self.head_dim, self.dims = head_dim, rotary_dims(head_dim, pct)
        inv_freq = base ** (-torch.arange(0, self.dims, 2, dtype=torch.float64) / self.dims)
        angles = torch.outer(torch.arange(max_len, dtype=torch.float64), inv_freq)  # (T, d/2)
        angles = torch.cat([angles, angles], dim=-1)
        # Not persistent: derived from the config, so checkpoints stay independent of max_len.
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, x: torch.Tensor, offset: int | torch.Tensor = 0) -> torch.Tensor:
        """x: (B, H, T, head_dim), positions offset..offset+T-1 (offset > 0: the new positions of a KV-cached
        decoding step, after the ``offset`` positions already cached), or ``offset`` a (B, T) tensor: each row's
        own positions (a left-padded batch, lit/models/kv_cache.py)."""
        if self.dims < self.head_dim:
            rotated, passed = x.split([self.dims, self.head_dim - self.dims], dim=-1)
            return torch.cat([self._rotate(rotated, offset), passed], dim=-1)
        return self._rotate(x, offset)

    def _rotate(self, x: torch.Tensor, offset: int | torch.Tensor = 0) -> torch.Tensor:
        T = x.shape[-2]
        if isinstance(offset, torch.Tensor):  # (B, T) positions: the table's rows per row, broadcast over heads
            cos, sin = self.cos[offset][:, None].to(x.dtype), self.sin[offset][:, None].to(x.dtype)
        else:
            cos, sin = self.cos[offset:offset + T].to(x.dtype), self.sin[offset:offset + T].to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin
