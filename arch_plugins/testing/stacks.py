"""The model stacks the kit builds a plugin into, found through entry points so that this package imports no
model code of its own.

``arch_plugins`` is the pure-PyTorch floor of the house: it names no model, no task and no Lightning. The
transformer stacks (GPT, ViT) live above it, and a package that provides stacks registers a builder for each
under the entry-point group ``arch_plugins.conformance_stacks`` (arch-lab registers ``gpt`` and ``vit`` from
``lit/models/conformance.py``). A test can also pass its own builders to the kit. A builder is called as
``builder(components, size)`` and returns a ``Built``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import torch
from torch import nn

GROUP = "arch_plugins.conformance_stacks"


@dataclass(frozen=True)
class Size:
    """The stack's dimensions. The defaults are deliberately not powers of two (48 wide, 3 heads of 16, 3 layers),
    so a plugin that assumes one is caught; the heads stay even for RoPE."""

    d_model: int = 48
    n_heads: int = 3
    n_layers: int = 3


@dataclass
class Built:
    """A model and how to make a batch for it: ``example(generator)`` gives an input tensor of batch size 4."""

    model: nn.Module
    example: Callable[[torch.Generator], torch.Tensor]


# components: kind -> (plugin name, its options); the kinds not named take the stack's defaults.
Components = Mapping[str, tuple[str, Mapping[str, Any]]]
StackBuilder = Callable[[Components, Size], Built]


class KindNotTaken(Exception):
    """A builder raises it when its stack has no place for a plugin kind (the kit then skips, and says so)."""


def stacks() -> dict[str, StackBuilder]:
    """Every registered stack builder, by name (imports each)."""
    found = {ep.name: ep for ep in metadata.entry_points(group=GROUP)}
    if not found:
        raise LookupError(f"no model stack is registered under the entry-point group {GROUP!r}; install arch-lab "
                          f"(`pip install -e .` at its root, again after its entry points change) or pass stacks=")
    return {name: ep.load() for name, ep in sorted(found.items())}
