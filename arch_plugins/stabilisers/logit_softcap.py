"""Logit soft-capping (Gemma 2): cap * tanh(logits / cap) on the head's output.

Smoothly bounds every logit to (-cap, cap) while leaving small logits almost unchanged (slope 1 at 0), which keeps
the output softmax from saturating; Gemma 2 caps its final logits at 30. Computed in float32: the loss reads float32
logits anyway, and tanh near the cap needs the mantissa.

Inside ``deferred_softcap()`` the cap passes the logits through unchanged and records its value instead: the chunked
training loss (``lit/readout_loss.py``) reads a chunk's logits that way and applies the cap inside its cross-entropy
(``softcapped_cross_entropy.py``), which keeps no fp32 copy of the logits for backward. The cap is the last thing
the readout applies (the logits site's forward hook), so deferring it to the loss computes the same thing.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import torch
from torch import nn

# The caps deferred in the current ``deferred_softcap()`` block (None outside one). A context variable, not a flag
# on the module: checkpointing's recomputation in backward enters its own block, on whichever thread runs it.
_deferred: contextvars.ContextVar[list[float] | None] = contextvars.ContextVar("deferred_softcaps", default=None)


@contextlib.contextmanager
def deferred_softcap() -> Iterator[list[float]]:
    """Within the block every ``LogitSoftCap`` returns its input and appends its cap to the list yielded: the
    caller applies the cap itself."""
    caps: list[float] = []
    token = _deferred.set(caps)
    try:
        yield caps
    finally:
        _deferred.reset(token)


class LogitSoftCap(nn.Module):
    """cap * tanh(x / cap)."""

    def __init__(self, cap: float):
        super().__init__()
        if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap > 0:
            raise ValueError(f"logit_softcap bounds the logits to (-cap, cap); give a positive number (Gemma 2 uses "
                             f"30) or null (off), got {cap!r}")
        self.cap = float(cap)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        deferred = _deferred.get()
        if deferred is not None:
            deferred.append(self.cap)
            return x
        return self.cap * torch.tanh(x.float() / self.cap)

    def extra_repr(self) -> str:
        return f"cap={self.cap}"
