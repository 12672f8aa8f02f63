"""Sinkhorn-Knopp in torch, as mHC uses it: a doubly stochastic matrix from logits, with a backward that recomputes
the iterates (``sinkhorn_knopp``), and the functions it is made of.

Its own module, below both the residual (``arch_plugins.residuals.manifold_hyper_connections``) and the fused op
(``arch_plugins.kernels.sinkhorn_knopp``), whose torch path these functions are: so neither imports the other.
"""

from __future__ import annotations

import torch


def sinkhorn_knopp(logits: torch.Tensor, iters: int, eps: float = 1e-6) -> torch.Tensor:
    """Project (..., n, n) logits onto the doubly stochastic matrices: exp, then ``iters`` times rows then columns.

    Each row's maximum is subtracted before exp (the first row normalisation cancels it, so only overflow changes);
    sums are floored at ``eps``, as Megatron-LM does, so an underflowed row cannot divide by zero. One autograd
    node (``_Sinkhorn``): the backward recomputes the iterations instead of keeping each one's tensors.
    """
    return _Sinkhorn.apply(logits, iters, eps)


def sinkhorn_steps(logits: torch.Tensor, iters: int, eps: float, keep: bool):
    """The forward iterations; with ``keep``, each normalisation's (output, floored sum, sum >= eps) too."""
    start = torch.exp(logits - logits.amax(dim=-1, keepdim=True))
    m, steps = start, []
    for _ in range(iters):
        for dim in (-1, -2):
            total = m.sum(dim=dim, keepdim=True)
            floored = total.clamp_min(eps)
            m = m / floored
            if keep:
                steps.append((dim, m, floored, total >= eps))
    return start, m, steps


class _Sinkhorn(torch.autograd.Function):
    """Sinkhorn-Knopp as one op: saves its logits only, and its backward runs the iterations again.

    Autograd through the loop would keep ~3 tensors per normalisation (40 normalisations at the paper's 20
    iterations) from the forward to the backward. The backward of one normalisation y = m / max(sum m, eps) is
    dm = (dy - [sum m >= eps] sum(dy * y)) / max(sum m, eps), the same expression autograd differentiates (clamp's
    gradient passes where the input is at least the bound). The row maximum subtracted before exp gets no gradient:
    it cancels exactly, because the first row sum is at least 1 (the maximum's exp(0)) and so never floored.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
        ctx.save_for_backward(logits)
        ctx.iters, ctx.eps = iters, eps
        return sinkhorn_steps(logits, iters, eps, keep=False)[1]

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        (logits,) = ctx.saved_tensors
        return sinkhorn_knopp_backward(logits, grad, ctx.iters, ctx.eps), None, None


def sinkhorn_knopp_backward(logits: torch.Tensor, grad: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """The logits' gradient of ``sinkhorn_knopp``, given its output's: the iterations run again, then each
    normalisation's gradient in reverse (also the torch path of the fused op, arch_plugins.kernels.sinkhorn_knopp)."""
    start, _, steps = sinkhorn_steps(logits, iters, eps, keep=True)
    for dim, out, floored, unfloored in reversed(steps):
        # grad - [sum m >= eps] sum(grad * y), the mask multiplied in (a where would cost two ops a step)
        through_sum = (grad * out).sum(dim=dim, keepdim=True)
        grad = torch.addcmul(grad, through_sum, unfloored, value=-1) / floored
    return grad * start
