"""The keys and values a causal stack has computed, kept between decoding steps (a KV cache).

Attention is the only part of the stack that reads other positions: everything else computes position t from
position t (a norm strategy, residual or projection that does not says so through its
``incremental_decoding_conflict`` hook, and ``GPT.generate`` then runs without a cache). So a decoding step can run
the new positions alone, if each attention layer appends their keys and values to those of the positions before
and attends over all of them; RoPE and learned positions start at ``length``, the number of positions cached.

One cache serves one batch of sequences that all have the same length (no padding), up to ``capacity`` positions
(the model's block_size: RoPE and position tables end there).
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(self, n_layers: int, capacity: int):
        self.capacity = capacity
        self.length = 0  # positions cached: the position of the next one
        # Allocated by each layer at its first step, in the dtype and on the device its keys come in (autocast).
        self.keys: list[torch.Tensor | None] = [None] * n_layers
        self.values: list[torch.Tensor | None] = [None] * n_layers

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``layer``'s keys and values of the new positions (B, H, T, head_dim) after the cached ones;
        returns the keys and values of every position so far (B, H, length + T, head_dim)."""
        start, end = self.length, self.length + k.shape[-2]
        if end > self.capacity:
            raise ValueError(f"the KV cache holds {self.capacity} positions; {end} were asked for")
        if self.keys[layer] is None:
            B, H, _, D = k.shape
            self.keys[layer] = k.new_empty(B, H, self.capacity, D)
            self.values[layer] = v.new_empty(B, H, self.capacity, v.shape[-1])
        keys, values = self.keys[layer], self.values[layer]
        keys[:, :, start:end] = k
        values[:, :, start:end] = v
        return keys[:, :, :end], values[:, :, :end]

    def advance(self, positions: int) -> None:
        """Count the positions the whole stack has just run (every layer extended the cache by them)."""
        self.length += positions


def causal_mask(new: int, total: int, device: torch.device) -> tuple[bool, torch.Tensor | None]:
    """SDPA's ``(is_causal, attn_mask)`` for ``new`` queries that are the last of ``total`` keys.

    SDPA's ``is_causal`` aligns its triangle top-left (query i sees keys 0..i), which is right only when the queries
    are all the keys; one new query sees every key; several new queries after cached ones need the triangle
    aligned bottom-right (query i sees keys 0..total - new + i)."""
    if new == total:
        return True, None
    if new == 1:
        return False, None
    return False, torch.ones(new, total, dtype=torch.bool, device=device).tril(total - new)
