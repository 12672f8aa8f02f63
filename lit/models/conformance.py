"""The GPT and ViT stacks as the conformance kit (``arch_plugins.testing``) builds them: one plugin swapped in,
every other component at its default. Registered as entry points, so the kit finds them without importing lit."""

from __future__ import annotations

import dataclasses

import torch

from arch_plugins.testing.stacks import Built, Components, KindNotTaken, Size
from lit.models.gpt import GPT
from lit.models.transformer import TransformerConfig
from lit.models.vit import ViT

VOCAB, SEQ = 37, 11  # a vocabulary and a sequence length of no special form
IMAGE, PATCH, CHANNELS, CLASSES = 12, 4, 3, 5  # 9 patches and a cls token: 10 tokens


def _config(components: Components, size: Size, **arch) -> TransformerConfig:
    fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    chosen = {}
    for kind, (name, options) in components.items():
        if kind not in fields or f"{kind}_options" not in fields:
            raise KindNotTaken(f"the transformer stack has no {kind!r} component")
        chosen.update({kind: name, f"{kind}_options": dict(options)})
    return TransformerConfig(d_model=size.d_model, n_heads=size.n_heads, n_layers=size.n_layers, **arch, **chosen)


def gpt(components: Components, size: Size) -> Built:
    model = GPT(VOCAB, SEQ, _config(components, size))
    return Built(model, lambda g: torch.randint(0, VOCAB, (4, SEQ), generator=g))


def vit(components: Components, size: Size) -> Built:
    model = ViT(CLASSES, IMAGE, PATCH, CHANNELS, _config(components, size, mlp="gelu", positions="none"))
    return Built(model, lambda g: torch.randn(4, CHANNELS, IMAGE, IMAGE, generator=g))
