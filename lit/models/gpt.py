"""GPT: token embedding + transformer stack + LM head, and sampling."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from arch_plugins.declarations import declare_role
from arch_plugins.interfaces import Role, Site
from lit.errors import ArchitectureError
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

    def forward(self, idx: torch.Tensor, readout: bool = True) -> torch.Tensor:
        """idx: (B, T) token ids -> logits (B, T, vocab); with ``readout=False``, the head's input (B, T, d), which
        a loss then passes through ``readout`` a chunk of tokens at a time (lit/readout_loss.py)."""
        T = idx.shape[1]
        if T > self.block_size:
            raise ArchitectureError(f"sequence length {T} exceeds block_size {self.block_size}, the length the model's "
                                    f"RoPE and position tables were built for; use the data's block_size for the model")
        x = self.tok(idx)
        if self.pos is not None:
            x = x + self.pos.weight[:T]
        h = self.stack(x)
        if self.readout_multiplier is not None:
            h = h * self.readout_multiplier
        return self.readout(h) if readout else h

    def readout(self, h: torch.Tensor) -> torch.Tensor:
        """The head's input -> logits: the LM head, then the norm strategy's logits site."""
        return self.logits(self.head(h))

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
        """Autoregressive sampling; temperature 0 is greedy. Returns (B, T + max_new_tokens)."""
        for _ in range(max_new_tokens):
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
        return idx
