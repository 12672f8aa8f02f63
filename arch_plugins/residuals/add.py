"""The plain residual sum."""

from __future__ import annotations

import torch

from arch_plugins.interfaces import ResidualHistory, ResidualMerge, ResidualType, StackInfo


class Add(ResidualMerge):
    def forward(self, h: torch.Tensor, branch: torch.Tensor, history: ResidualHistory) -> torch.Tensor:
        return h + branch


class AddResidual(ResidualType):
    """Plain residual sum: h + f(h)."""

    def merge(self, sublayer: str, layer: int, stack: StackInfo) -> Add:
        return Add()
