"""Logit soft-capping (Gemma 2): cap * tanh(logits / cap) on the head's output.

Smoothly bounds every logit to (-cap, cap) while leaving small logits almost unchanged (slope 1 at 0), which keeps
the output softmax from saturating; Gemma 2 caps its final logits at 30. Computed in float32: the loss reads float32
logits anyway, and tanh near the cap needs the mantissa.
"""

from __future__ import annotations

import torch
from torch import nn


class LogitSoftCap(nn.Module):
    """cap * tanh(x / cap)."""

    def __init__(self, cap: float):
        super().__init__()
        if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap > 0:
            raise ValueError(f"logit_softcap bounds the logits to (-cap, cap); give a positive number (Gemma 2 uses "
                             f"30) or null (off), got {cap!r}")
        self.cap = float(cap)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cap * torch.tanh(x.float() / self.cap)

    def extra_repr(self) -> str:
        return f"cap={self.cap}"
