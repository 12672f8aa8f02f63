"""Muon's orthogonalisation: the quintic Newton-Schulz iteration that maps a matrix G = U S V^T to about U V^T.

Kept here rather than imported from ``torch.optim._muon``: that is a private module, present only in recent torch
releases, while the project supports older ones (pyproject). The arithmetic is the same as torch's (and Keller
Jordan's): bf16, the wide orientation, G / ||G||_F so that every singular value is at most 1, then per step
X <- a X + (b A + c A^2) X with A = X X^T. The coefficients (3.4445, -4.7750, 2.0315) maximise the slope at zero,
so the singular values land in about [0.5, 1.5] rather than at 1, which does not hurt training (Jordan 2024).
``tests/test_optimizers.py`` checks it against torch's routine where torch has one. ``orthogonalize_stack`` runs
the same iteration on a stack of same-shape matrices, each normalised by its own norm, in one batched product per
step (``shape_groups.py`` groups Muon's matrices by shape).
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
    return _newton_schulz(grad, coefficients, steps, eps)


def orthogonalize_stack(stack: torch.Tensor, coefficients: tuple[float, float, float] = COEFFICIENTS,
                        steps: int = STEPS, eps: float = EPS) -> torch.Tensor:
    """``orthogonalize`` of each matrix of the (n, rows, columns) ``stack`` at once (bf16): one batched product per
    step instead of n, each matrix scaled by its own norm, so that n matrices cost one call's dispatch."""
    if stack.ndim != 3:
        raise ValueError(f"a stack of matrices is 3-D (n, rows, columns); got shape {tuple(stack.shape)}")
    return _newton_schulz(stack, coefficients, steps, eps)


def _newton_schulz(grad: torch.Tensor, coefficients: tuple[float, float, float], steps: int,
                   eps: float) -> torch.Tensor:
    a, b, c = coefficients
    tall = grad.shape[-2] > grad.shape[-1]
    x = grad.to(dtype=torch.bfloat16, copy=True)
    if tall:  # iterate on the wide orientation: the Gram matrix is the smaller one
        x = x.mT
    # A matrix's norm is over all its entries; torch's routine calls x.norm(), kept for the 2-D case's bits.
    x.div_((x.norm() if x.ndim == 2 else x.norm(dim=(-2, -1), keepdim=True)).clamp(min=eps))
    # The batched products called directly: ``@`` on 3-D tensors is matmul's expand/view/bmm chain, 4 calls for 1.
    multiply, multiply_add = (torch.mm, torch.addmm) if x.ndim == 2 else (torch.bmm, torch.baddbmm)
    for _ in range(steps):
        gram = multiply(x, x.mT)
        x = multiply_add(x, multiply_add(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.mT if tall else x
