"""Optimizer groups and the learning-rate schedule."""

from __future__ import annotations

import math

import pytest

from lit.models import GPT, TransformerConfig
from lit.optim import adamw, warmup_cosine


def test_matrices_decay_vectors_do_not():
    model = GPT(50, 8, TransformerConfig(d_model=32, n_layers=2, n_heads=4, bias=True))
    decay, no_decay = adamw(model, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95)).param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() == 1 for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))
    assert any(p is model.tok.weight for p in decay["params"])


@pytest.mark.parametrize("step, expected", [(0, 0.1), (9, 1.0), (10, 1.0), (55, 0.55), (100, 0.1), (150, 0.1)])
def test_warmup_then_cosine(step, expected):
    assert math.isclose(warmup_cosine(step, warmup_steps=10, total_steps=100, min_lr_ratio=0.1), expected,
                        abs_tol=1e-9)
