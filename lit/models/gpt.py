"""GPT: token embedding + transformer stack + LM head, and sampling."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from arch_plugins.declarations import declare_role
from arch_plugins.interfaces import Role, Site
from lit.errors import ArchitectureError
from lit.models.kv_cache import KVCache
from lit.models.transformer import TransformerConfig, TransformerStack


class GPT(nn.Module):
    def __init__(self, vocab_size: int, block_size: int, arch: TransformerConfig, tie_embeddings: bool = False):
        super().__init__()
        self.vocab_size, self.block_size = vocab_size, block_size
        d = arch.d_model
        self.tok = nn.Embedding(vocab_size, d)
        nn.init.normal_(self.tok.weight, std=arch.init_std)
        self.pos = None
        if arch.positions == "learned":
            self.pos = nn.Embedding(block_size, d)
            nn.init.normal_(self.pos.weight, std=arch.init_std)
        self.stack = TransformerStack(arch, causal=True, max_len=block_size)
        self.head = nn.Linear(d, vocab_size, bias=False)
        nn.init.normal_(self.head.weight, std=arch.init_std)
        declare_role(self.tok, "weight", Role.EMBEDDING)
        if self.pos is not None:
            declare_role(self.pos, "weight", Role.POSITION)
        if tie_embeddings:
            self.head.weight = self.tok.weight  # one parameter, one role: the embedding's
        else:
            declare_role(self.head, "weight", Role.HEAD)
        self.logits = self.stack.site(Site.LOGITS, vocab_size)
        # Both matrices are (vocab, d): d_model is dim 1.
        self.stack.constrain(self.tok, Role.EMBEDDING, dim=1)
        self.stack.constrain(self.head, Role.HEAD, dim=1)
        self.readout_multiplier = self.stack.output_multiplier
        self.stack.parametrize(self)

    def forward(self, idx: torch.Tensor, readout: bool = True, cache: KVCache | None = None) -> torch.Tensor:
        """idx: (B, T) token ids -> logits (B, T, vocab); with ``readout=False``, the head's input (B, T, d), which
        a loss then passes through ``readout`` a chunk of tokens at a time (lit/readout_loss.py). With a ``cache``
        (``generate``): idx holds the T tokens after the ``cache.length`` cached ones, at positions from there."""
        T = idx.shape[1]
        offset = cache.length if cache is not None else 0
        if offset + T > self.block_size:
            raise ArchitectureError(f"sequence length {offset + T} exceeds block_size {self.block_size}, the length "
                                    f"the model's RoPE and position tables were built for; use the data's block_size "
                                    f"for the model")
        x = self.tok(idx)
        if self.pos is not None:
            positions = cache.positions(T, idx.device) if cache is not None else 0
            x = x + (self.pos.weight[positions] if isinstance(positions, torch.Tensor)
                     else self.pos.weight[positions:positions + T])
        h = self.stack(x, cache)
        if self.readout_multiplier is not None:
            h = h * self.readout_multiplier
        return self.readout(h) if readout else h

    def readout(self, h: torch.Tensor) -> torch.Tensor:
        """The head's input -> logits: the LM head, then the norm strategy's logits site."""
        return self.logits(self.head(h))

    def kv_cache_conflict(self) -> str | None:
        """Why ``generate`` cannot keep a KV cache for this model now (one line naming the cause), or None."""
        if self.training:
            return ("the model is in training mode, where a norm may normalise by statistics over every position of "
                    "the batch (BatchNorm-family strategies); call .eval() first")
        return self.stack.incremental_decoding_conflict()

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, generator: torch.Generator | None = None,
                 use_cache: bool = True, pad: torch.Tensor | None = None,
                 stop: Callable[[torch.Tensor], bool] | None = None, stop_every: int = 16) -> torch.Tensor:
        """Autoregressive sampling; temperature 0 is greedy. Returns (B, T + max_new_tokens).

        With ``use_cache`` each step runs the new token alone against the keys and values kept from the steps before
        (lit/models/kv_cache.py): the same tokens and logits as recomputing the whole context (tests/test_kv_cache.py),
        at a cost per token that does not grow with the context's length. Without it, or where ``kv_cache_conflict``
        names a component that computes a position from other positions (a warning says which), every step
        recomputes the context. Once the sequence outgrows block_size the context window slides, every kept token
        moves to a new position and sees fewer tokens before it, so from then on each step recomputes the window,
        cache or not: the output stays that of the uncached model.

        ``pad`` (B,): a left-padded batch of prompts of different lengths, row b's first ``pad[b]`` columns being
        padding. Each row then decodes what it would alone (its positions start at its first token; padding is
        hidden from attention). That needs the KV cache and no sliding window: a model that cannot cache, or a
        prompt plus ``max_new_tokens`` longer than block_size, is refused. ``stop(new_ids)`` is asked every
        ``stop_every`` tokens whether every row is done; True ends decoding there.
        """
        conflict = self.kv_cache_conflict() if use_cache else None
        if pad is not None:
            if conflict is not None or not use_cache:
                raise ValueError(f"a left-padded batch needs the KV cache; this model has none now: "
                                 f"{conflict or 'use_cache=False'}")
            if idx.shape[1] + max_new_tokens > self.block_size:
                raise ValueError(f"a left-padded batch decodes within block_size ({self.block_size}); "
                                 f"{idx.shape[1]} + {max_new_tokens} tokens were asked for")
        if conflict is not None:
            warnings.warn(f"generate runs without a KV cache: {conflict}", stacklevel=2)
        cache = self.stack.new_cache(pad) if use_cache and conflict is None else None
        prompt_length = idx.shape[1]
        for step in range(max_new_tokens):
            if cache is not None and idx.shape[1] <= self.block_size:
                # The first step reads the whole prompt (prefill), every later one the token sampled last.
                h = self(idx[:, cache.length:], readout=False, cache=cache)
                logits = self.readout(h[:, -1:, :])[:, -1, :].float()
            else:
                cache = None  # past block_size: the window slides (see above)
                logits = self(idx[:, -self.block_size:])[:, -1, :].float()
            if temperature == 0:
                nxt = logits.argmax(dim=-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None:
                    kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                nxt = torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)
            idx = torch.cat([idx, nxt], dim=1)
            if stop is not None and (step + 1) % stop_every == 0 and stop(idx[:, prompt_length:]):
                break
        return idx
