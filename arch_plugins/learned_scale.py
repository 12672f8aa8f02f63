"""nGPT's scale trick (paper §2.5): a learnable vector stored at one value and used at another.

The parameter is created filled with ``scale`` and used in the forward pass as
``stored * (init / scale)``, so its effective value starts at ``init`` while an optimizer step of
size ~lr moves the effective value by ~lr * init / scale. Choosing ``scale`` therefore sets the
vector's effective learning rate without a separate optimizer group. Shared by the hypersphere norm
strategy (s_qk, s_u/s_v, s_z) and the ngpt residual (alpha).
"""

from __future__ import annotations

import torch
from torch import nn

from arch_plugins.declarations import declare_role
from arch_plugins.interfaces import Kind


class LearnedScale(nn.Module):
    """A vector (or any shape) whose effective value is ``stored * init / scale * factor``.

    ``factor`` is a constant folded into the same multiplier (nGPT's sqrt(d_model) on the MLP hidden).
    """

    def __init__(self, shape: int | tuple[int, ...], *, init: float, scale: float, factor: float = 1.0,
                 name: str = "scale", role: str = "learned_scale", group: str = "other"):
        super().__init__()
        if not scale > 0:
            raise ValueError(f"{name}_scale must be positive (it divides the stored value), got {scale}")
        self.stored = nn.Parameter(torch.full(shape if isinstance(shape, tuple) else (shape,), float(scale)))
        # One dim of the size the caller gives (d_model, the MLP hidden, the vocabulary): a vector for the optimizer.
        declare_role(self, "stored", role, kind=Kind.VECTOR, group=group)
        self.init, self.scale, self.factor = float(init), float(scale), float(factor)
        self.name = name  # what the paper calls it (s_qk, s_uv, s_z, alpha): errors and diagnostics say it
        # One Python float: the effective vector costs a single multiply of a small parameter.
        self.multiplier = self.init / self.scale * self.factor

    def forward(self) -> torch.Tensor:
        return self.stored * self.multiplier

    def effective(self) -> torch.Tensor:
        """The learned value as the paper names it (starts at ``init``): ``forward()`` without the constant factor."""
        return self.stored * (self.init / self.scale)

    def extra_repr(self) -> str:
        return f"shape={tuple(self.stored.shape)}, init={self.init}, scale={self.scale}, factor={self.factor:g}"
