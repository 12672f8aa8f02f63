"""The keys and values a causal stack has computed, kept between decoding steps (a KV cache).

Attention is the only part of the stack that reads other positions: everything else computes position t from
position t (a norm strategy, residual or projection that does not says so through its
``incremental_decoding_conflict`` hook, and ``GPT.generate`` then runs without a cache). So a decoding step can run
the new positions alone, if each attention layer appends their keys and values to those of the positions before
and attends over all of them; RoPE and learned positions start at ``length``, the number of positions cached.

One cache serves one batch of sequences up to ``capacity`` slots (the model's block_size: RoPE and position tables
end there). Sequences of different lengths share a batch left-padded: ``pad`` says how many slots of each row come
before its first token. Those slots are hidden from every real position's attention, and each row's positions start
at its first token, so a row computes what it would alone (tests/test_kv_cache.py). A padding slot attends to itself
only (an all-masked row would be NaN, and NaN values leak through a zero attention weight); what it computes is
never read.
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(self, n_layers: int, capacity: int, pad: torch.Tensor | None = None):
        self.capacity = capacity
        self.length = 0  # slots cached: the slot of the next one
        self.pad = pad  # (B,) padding slots before each row's first token; None: no row is padded
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

    def positions(self, new: int, device: torch.device) -> int | torch.Tensor:
        """The positions of the next ``new`` slots: the offset of all rows (int) when none is padded, else (B, new)
        per row, counted from the row's first token (its padding slots at 0: they are never read)."""
        if self.pad is None:
            return self.length
        slots = torch.arange(self.length, self.length + new, device=device)
        return (slots[None, :] - self.pad[:, None]).clamp_min(0)

    def attention_mask(self, new: int, total: int, device: torch.device) -> tuple[bool, torch.Tensor | None]:
        """SDPA's ``(is_causal, attn_mask)`` for ``new`` queries that are the last of ``total`` keys: causal, and
        with padded rows a (B, 1, new, total) mask that also hides each row's padding slots."""
        if self.pad is None:
            return causal_mask(new, total, device)
        query_slots = torch.arange(total - new, total, device=device)[:, None]
        key_slots = torch.arange(total, device=device)[None, :]
        seen = (key_slots <= query_slots)[None] & (key_slots >= self.pad[:, None, None])
        return False, (seen | (key_slots == query_slots)[None])[:, None]

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
