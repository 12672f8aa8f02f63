"""Optimizer groups and the learning-rate schedule."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest
import torch
from torch import nn

import arch_plugins.optimizers
import lit.optim
from arch_plugins import registry
from arch_plugins.norms.dyt import DynamicTanh, EmbeddingScale
from arch_plugins.weight_decay import declare_weight_decay
from lit.models import GPT, TransformerConfig
from lit.optim import adamw, warmup_cosine

OPTIMIZERS = Path(arch_plugins.optimizers.__file__).parent


def test_matrices_decay_vectors_do_not():
    model = GPT(50, 8, TransformerConfig(d_model=32, n_layers=2, n_heads=4, bias=True))
    decay, no_decay = adamw(model, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95)).param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() == 1 for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))
    assert any(p is model.tok.weight for p in decay["params"])


def groups(model: nn.Module) -> tuple[set[int], set[int]]:
    """(ids of the decayed parameters, ids of the others); an empty group is left out of the optimizer."""
    found = {0.1: set(), 0.0: set()}
    for group in adamw(model, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95)).param_groups:
        found[group["weight_decay"]] |= {id(p) for p in group["params"]}
    return found[0.1], found[0.0]


def test_a_module_declares_weight_decay_per_parameter():
    model = GPT(50, 8, TransformerConfig(d_model=32, n_layers=2, n_heads=4, bias=True))
    gain, other_gain = model.stack.blocks[0].attn_in.weight, model.stack.blocks[1].attn_in.weight
    assert gain.dim() == 1 and id(gain) in groups(model)[1]
    declare_weight_decay(model.stack.blocks[0].attn_in, "weight", True)
    decay, no_decay = groups(model)
    assert id(gain) in decay  # a declared vector decays
    assert id(other_gain) in no_decay  # an undeclared one keeps the default
    declare_weight_decay(model.head, "weight", False)
    decay, no_decay = groups(model)
    assert id(model.head.weight) in no_decay and id(gain) in decay  # a matrix can opt out
    assert len(decay) + len(no_decay) == len(list(model.parameters()))
    with pytest.raises(ValueError, match="no parameter"):
        declare_weight_decay(model.head, "nope", True)


@pytest.mark.parametrize("path", [lit.optim.__file__, *sorted(str(p) for p in OPTIMIZERS.glob("*.py"))])
def test_the_optimizer_names_no_plugin(path):
    tree = ast.parse(open(path).read())
    words = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    words |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    words |= {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    plugins = {name for kind in ("norm", "residual", "projection") for name in registry.names(kind)}
    assert not words & (plugins | {"alpha", "gamma", "scale", "DynamicTanh"})
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    # What parameters are comes from their declarations (and the optimizer plugins from the registry), never
    # from a plugin's module.
    allowed = {"arch_plugins.declarations", "arch_plugins.interfaces", "arch_plugins.registry", "arch_plugins"}
    assert {m for m in imported if m.startswith("arch_plugins") and not m.startswith("arch_plugins.optimizers")} \
        <= allowed


def test_dyt_decays_its_scalars_in_a_language_model_as_the_reference_does():
    """DyT's LLaMA code decays every parameter (AdamW over model.parameters(), wd 0.1: alpha, gamma and the
    embedding scalar included); its ViT code skips 1-D parameters. Under the ndim rule none of them decayed."""
    torch.manual_seed(0)
    lm = GPT(50, 8, TransformerConfig(d_model=32, n_layers=2, n_heads=4, norm="dyt"))
    dyt = [p for m in lm.modules() if isinstance(m, (DynamicTanh, EmbeddingScale)) for p in m.parameters()]
    assert len(dyt) == 2 * 2 * 2 + 2 + 1  # alpha and gamma per DyT (2 per block, and the final), the scalar
    decay, no_decay = groups(lm)
    assert all(id(p) in decay for p in dyt)
    off = GPT(50, 8, TransformerConfig(d_model=32, n_layers=2, n_heads=4, norm="dyt",
                                       norm_options={"decay_all": False}))
    decay, no_decay = groups(off)
    assert all(id(p) in no_decay for m in off.modules() if isinstance(m, (DynamicTanh, EmbeddingScale))
               for p in m.parameters())
    assert registry.create("norm", "dyt", {"decay_all": True}).decay_all is True


@pytest.mark.parametrize("step, expected", [(0, 0.1), (9, 1.0), (10, 1.0), (55, 0.55), (100, 0.1), (150, 0.1)])
def test_warmup_then_cosine(step, expected):
    assert math.isclose(warmup_cosine(step, warmup_steps=10, total_steps=100, min_lr_ratio=0.1), expected,
                        abs_tol=1e-9)
