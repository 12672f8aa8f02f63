"""AttnRes's depth softmax in torch: ``out = sum_i softmax_i(u . v_i * r_i) v_i`` over the stacked sources, one op
forward and one backward (``DepthSoftmax``), and the functions it is made of.

Its own module, below both the residual (``arch_plugins.residuals.attnres``) and the fused op
(``arch_plugins.kernels.depth_softmax``), whose torch path and recomputing backward these functions are: so neither
imports the other.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from arch_plugins.autocast import autocast_off


class DepthSoftmax(torch.autograd.Function):
    """``out = sum_i softmax_i(u . v_i * r_i) v_i`` with ``r_i = rsqrt(mean(v_i^2) + eps)`` (1 when ``eps`` is None),
    over the stacked sources, as one op forward and one backward.

    Computed in the query's dtype (float32) with autocast off, whatever the sources' dtypes: the stack is upcast
    inside and freed there. Saved for backward: the sources as given, and the logits, the weights and the ``r_i``
    (one value per token per source); backward stacks the sources again. Per-token values keep a trailing axis of 1
    so that they broadcast over the width without an unsqueeze (each one an op).

    Not a buffer that each state is written into once as it appears, which would spare the forward's stack copy:
    a later write into it would invalidate what the earlier consumers saved of it (autograd's version check), and
    the copy costs bytes, where this shape's step is paid in dispatched ops.
    """

    @staticmethod
    def forward(ctx, query: torch.Tensor, eps: float | None, *sources: torch.Tensor) -> torch.Tensor:
        out, weights, logits, inverse_rms = depth_softmax_forward(query, eps, sources)
        ctx.save_for_backward(query, weights, logits, inverse_rms, *sources)
        return out

    @staticmethod
    @once_differentiable  # the saved logits and weights carry no graph: a second derivative would be wrong
    def backward(ctx, grad_out: torch.Tensor):
        query, weights, logits, inverse_rms, *sources = ctx.saved_tensors
        grad_query, grad_values = depth_softmax_backward(query, weights, logits, inverse_rms, sources, grad_out,
                                                         ctx.needs_input_grad[0])
        return (grad_query, None, *per_source(grad_values, sources))


def depth_softmax_forward(query: torch.Tensor, eps: float | None, sources) -> tuple[torch.Tensor, ...]:
    """``DepthSoftmax``'s forward: (out, weights, logits, inverse_rms or None), per-token values (m, ..., 1).

    Also the torch path of the fused op (arch_plugins.kernels.depth_softmax), which recomputes it in backward.
    """
    width = query.shape[-1]
    with autocast_off(query.device.type):
        values = torch.stack(sources).to(query.dtype)  # (m, ..., d); mixed dtypes promote in the stack itself
        logits = torch.mv(values.view(-1, width), query).view(*values.shape[:-1], 1)
        inverse_rms = None
        if eps is not None:
            # The norm of v, squared, as the per-source form computed it (the same rounding as before).
            squares = torch.linalg.vector_norm(values, dim=-1, keepdim=True).square()
            inverse_rms = torch.rsqrt(squares / width + eps)
            logits = logits * inverse_rms
        weights = logits.softmax(0)
        out = (weights * values).sum(0)
    return out, weights, logits, inverse_rms


def depth_softmax_backward(query: torch.Tensor, weights: torch.Tensor, logits: torch.Tensor,
                           inverse_rms: torch.Tensor | None, sources, grad_out: torch.Tensor,
                           needs_query_grad: bool) -> tuple[torch.Tensor | None, torch.Tensor]:
    """``DepthSoftmax``'s backward from what its forward kept: (the query's gradient or None, the sources'
    gradients stacked, in the query's dtype: ``per_source`` splits them)."""
    width = query.shape[-1]
    with autocast_off(query.device.type):
        values = torch.stack(sources).to(query.dtype)
        grad_weights = (values * grad_out).sum(-1, keepdim=True)
        grad_logits = torch._softmax_backward_data(grad_weights, weights, 0, query.dtype)
        grad_values = weights * grad_out
        if inverse_rms is None:
            grad_dots = grad_logits
        else:
            grad_dots = grad_logits * inverse_rms
            # logit = dot * r with r = (|v|^2 / d + eps)^(-1/2): through r, d logit / d v = -dot * r^3 * v / d,
            # and dot * r^3 = logit * r^2.
            through_rms = grad_dots * logits * inverse_rms
            grad_values = torch.addcmul(grad_values, through_rms, values, value=-1 / width)
        grad_values = torch.addcmul(grad_values, grad_dots, query)
        grad_query = None
        if needs_query_grad:
            grad_query = (grad_dots * values).sum(tuple(range(values.dim() - 1)))
    return grad_query, grad_values


def per_source(grad_values: torch.Tensor, sources: list[torch.Tensor]) -> list[torch.Tensor]:
    """The stacked gradient split into one per source, each in its source's dtype: one cast for the sources that
    share the last one's dtype (the bf16 sublayer outputs), one more for each other (the float32 embedding)."""
    common = sources[-1].dtype
    grads = list(grad_values.to(common).unbind(0))
    for index, source in enumerate(sources):
        if source.dtype != common:
            grads[index] = grad_values[index].to(source.dtype)
    return grads
