"""Gated attention (Bondarenko, Nagel, Blankevoort; "Quantizable Transformers: Removing Outliers by Helping Attention
Heads Do Nothing", NeurIPS 2023; code qualcomm-ai-research/outlier-free-transformers).

Each head's output is multiplied by ``sigmoid(G_h(x_h))``, a gate the head computes from its own slice of the
attention input: ``x`` (B, T, d_model, the normalised sublayer input) is cut into the heads' ``head_dim`` slices and
head h applies a ``Linear(head_dim, 1)`` to its slice, per token. That is the reference's ``conditional_per_token``
gate with separate per-head predictors (``transformers_language/models/opt_attention.py:103-138`` builds them,
the ``*** Gating ***`` block of its ``forward`` applies them), the variant its OPT and BERT scripts run
(``scripts/opt_125m_gated_attention.sh``: ``--attn_gate_type conditional_per_token --attn_gate_init 0.25``).
A head that wants to do nothing closes its gate instead of parking its attention on a delimiter token and
writing an outlier.

Init as the reference: each predictor is an ``nn.Linear`` (kaiming-uniform weight, U(-1/sqrt(head_dim), ...)),
with its bias set to ``logit(init)`` so that a gate whose weight contributes nothing opens to ``init``
(``opt_attention.py:127-131``; 0.25 in the OPT scripts). ``init=None`` keeps nn.Linear's default bias.
The H predictors are stored as one (H, head_dim) weight and one (H,) bias: the same function, one einsum.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from arch_plugins.declarations import declare_role, declare_weight_decay
from arch_plugins.interfaces import Kind, Role


def logit(p: float) -> float:
    """The bias whose sigmoid is ``p``, clipped as the reference's ``logit`` (eps 1e-16)."""
    p = min(max(p, 1e-16), 1 - 1e-16)
    return -math.log(1 / p - 1)


class HeadGate(nn.Module):
    """``y_h *= sigmoid(x_h . w_h + b_h)`` per head h and token, x_h the head's slice of the attention input."""

    def __init__(self, num_heads: int, head_dim: int, init: float | None):
        super().__init__()
        if init is not None and (isinstance(init, bool) or not 0.0 < float(init) < 1.0):
            raise ValueError(f"gated_attention_init is the gate's opening at init, a probability in (0, 1) (the "
                             f"paper's OPT runs use 0.25), or null for nn.Linear's default bias; got {init!r}")
        self.num_heads, self.head_dim, self.init = num_heads, head_dim, init
        self.weight = nn.Parameter(torch.empty(num_heads, head_dim))
        self.bias = nn.Parameter(torch.empty(num_heads))
        # One small map per head from its slice of the input to one gate logit: a readout whose fan-in is head_dim
        # (it grows when heads widen, not when heads are added: the base shape tells); nn.Linear's init is already
        # over sqrt(fan-in). It decays as the matrix it is stored as.
        declare_role(self, "weight", "attention_gate", kind=Kind.READOUT, init="fan_in")
        declare_weight_decay(self, "weight", True)
        declare_role(self, "bias", Role.BIAS)
        bound = 1 / math.sqrt(head_dim)  # nn.Linear(head_dim, 1)'s init: weight and bias both U(-bound, bound)
        nn.init.uniform_(self.weight, -bound, bound)
        if init is None:
            nn.init.uniform_(self.bias, -bound, bound)
        else:
            nn.init.constant_(self.bias, logit(float(init)))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        heads = x.view(B, T, self.num_heads, self.head_dim)
        alpha = torch.einsum("bthd,hd->bht", heads, self.weight.to(x.dtype)) + self.bias.to(x.dtype)[:, None]
        return y * torch.sigmoid(alpha).unsqueeze(-1).to(y.dtype)

    def extra_repr(self) -> str:
        return f"heads={self.num_heads}, head_dim={self.head_dim}, init={self.init}"
