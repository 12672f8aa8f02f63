"""Muon's orthogonalisation: the quintic Newton-Schulz iteration that maps a matrix G = U S V^T to about U V^T.

Kept here rather than imported from ``torch.optim._muon``: that is a private module, present only in recent torch
releases, while the project supports older ones (pyproject). The arithmetic is the same as torch's (and Keller
Jordan's): bf16, the wide orientation, G / ||G||_F so that every singular value is at most 1, then per step
X <- a X + (b A + c A^2) X with A = X X^T. The coefficients (3.4445, -4.7750, 2.0315) maximise the slope at zero,
so the singular values land in about [0.5, 1.5] rather than at 1, which does not hurt training (Jordan 2024).
``tests/test_optimizers.py`` checks it against torch's routine where torch has one.
"""

from __future__ import annotations

import torch

COEFFICIENTS = (3.4445, -4.7750, 2.0315)
STEPS = 5
EPS = 1e-7


def orthogonalize(grad: torch.Tensor, coefficients: tuple[float, float, float] = COEFFICIENTS, steps: int = STEPS,
                  eps: float = EPS) -> torch.Tensor:
    """The Newton-Schulz approximation of the orthogonal factor of the 2-D ``grad`` (returned in bf16)."""
    if grad.ndim != 2:
        raise ValueError(f"Newton-Schulz orthogonalises a matrix; got a tensor of shape {tuple(grad.shape)}")
    a, b, c = coefficients
    tall = grad.shape[0] > grad.shape[1]
    x = grad.to(dtype=torch.bfloat16, copy=True)
    if tall:  # iterate on the wide orientation: the Gram matrix is the smaller one
        x = x.T
    x.div_(x.norm().clamp(min=eps))
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x
