"""AttnRes's depth softmax as one fused op: out = sum_i softmax_i(u . v_i * r_i) v_i over m sources, per token.

The torch path (``arch_plugins.residuals.depth_softmax.DepthSoftmax``) stacks the sources, upcasts the stack to fp32,
and runs a GEMV, a norm, a softmax over depth and a weighted sum: about ten kernels forward and fifteen backward per
consumer, several of them over the fp32 copy of the stack. Here (Liger-Kernel's ``ops/attn_res.py`` plan, written
for this module's conventions) one program holds ``BLOCK_M`` tokens' rows and reads each source once forward,
with an online softmax over depth (running maximum and sum, the weighted sum rescaled as the maximum grows):

    r_i = rsqrt(mean(v_i^2) + eps) (1 without a key norm),  logit_i = (u . v_i) r_i,  w = softmax(logit),
    out = sum_i w_i v_i                                       in fp32, whatever the sources' dtype

Backward, given g: d logit_i = w_i (v_i . g - out . g),  d dot_i = d logit_i r_i,
    dv_i = w_i g + d dot_i u - (d dot_i logit_i r_i / d) v_i,   du = sum over tokens and sources of d dot_i v_i.
It saves nothing but its inputs (the sources, which the history keeps anyway, and u) and recomputes the rest:
a first pass over the sources rebuilds the softmax's maximum and sum and out . g, a second writes each dv_i. du
is summed per program over the tiles it loops over, then across programs by torch.

Layout: the sources are stacked once into (m, tokens, d) in their common dtype (bf16 under autocast) and read from
there, as the torch path stacks them; one buffer of pointers instead would spare that copy, but needs a
host-to-device copy per call, which a captured CUDA graph cannot replay. The stacked gradient comes back in the
same dtype and ``depth_softmax.per_source`` splits it.

The op runs the Triton kernel on CUDA tensors (or anywhere in Triton's interpreter) and the torch path elsewhere,
and for float64; plugins choose it through ``dispatch.use_triton``.
"""

import functools

import torch

from arch_plugins.kernels.dispatch import (
    TritonKernel,
    as_rows,
    cdiv,
    on_device,
    persistent_programs,
    row_tile,
    triton_runs_on,
)

try:
    import triton.language as tl
except Exception:  # triton is optional: dispatch refuses kernel: triton without it
    tl = None

if tl is not None:

    def _forward(v_ptr, q_ptr, out_ptr, n_sources, n_rows, width, eps, NORMALISE: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.arange(0, BLOCK_D)
        col_mask = cols < width
        mask = (rows < n_rows)[:, None] & col_mask[None, :]
        rows = rows.to(tl.int64)
        q = tl.load(q_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
        running_max = tl.full((BLOCK_M,), float("-inf"), tl.float32)
        total = tl.zeros((BLOCK_M,), tl.float32)
        acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
        for i in range(n_sources):
            v = tl.load(v_ptr + (i * n_rows + rows)[:, None] * width + cols[None, :], mask=mask,
                        other=0.0).to(tl.float32)
            logit = tl.sum(v * q[None, :], axis=1)
            if NORMALISE:
                logit = logit * tl.rsqrt(tl.sum(v * v, axis=1) / width + eps)
            new_max = tl.maximum(running_max, logit)
            rescale = tl.exp(running_max - new_max)  # 0 at the first source (exp(-inf))
            p = tl.exp(logit - new_max)
            total = total * rescale + p
            acc = acc * rescale[:, None] + p[:, None] * v
            running_max = new_max
        out = acc / total[:, None]
        tl.store(out_ptr + rows[:, None] * width + cols[None, :], out.to(out_ptr.dtype.element_ty), mask=mask)

    def _backward(v_ptr, q_ptr, g_ptr, dv_ptr, dq_partial_ptr, n_sources, n_rows, width, g_stride, eps, n_tiles,
                  NORMALISE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
        pid = tl.program_id(0)
        cols = tl.arange(0, BLOCK_D)
        col_mask = cols < width
        q = tl.load(q_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
        dq = tl.zeros((BLOCK_D,), tl.float32)
        for tile in range(pid, n_tiles, tl.num_programs(0)):
            rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
            mask = (rows < n_rows)[:, None] & col_mask[None, :]
            rows = rows.to(tl.int64)
            g = tl.load(g_ptr + rows[:, None] * g_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            # Pass 1: the softmax's maximum and sum, and out . g = sum_i w_i (v_i . g), online as in the forward
            # (its lines again: a kernel can call only other jitted functions, and these are built lazily, per
            # dispatch.TritonKernel).
            running_max = tl.full((BLOCK_M,), float("-inf"), tl.float32)
            total = tl.zeros((BLOCK_M,), tl.float32)
            weighted = tl.zeros((BLOCK_M,), tl.float32)
            for i in range(n_sources):
                v = tl.load(v_ptr + (i * n_rows + rows)[:, None] * width + cols[None, :], mask=mask,
                            other=0.0).to(tl.float32)
                logit = tl.sum(v * q[None, :], axis=1)
                if NORMALISE:
                    logit = logit * tl.rsqrt(tl.sum(v * v, axis=1) / width + eps)
                new_max = tl.maximum(running_max, logit)
                rescale = tl.exp(running_max - new_max)
                p = tl.exp(logit - new_max)
                total = total * rescale + p
                weighted = weighted * rescale + p * tl.sum(v * g, axis=1)
                running_max = new_max
            out_dot_g = weighted / total
            # Pass 2: each source's gradient.
            for i in range(n_sources):
                offsets = (i * n_rows + rows)[:, None] * width + cols[None, :]
                v = tl.load(v_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
                dot = tl.sum(v * q[None, :], axis=1)
                if NORMALISE:
                    r = tl.rsqrt(tl.sum(v * v, axis=1) / width + eps)
                else:
                    r = tl.full((BLOCK_M,), 1.0, tl.float32)
                logit = dot * r
                w = tl.exp(logit - running_max) / total
                grad_dot = w * (tl.sum(v * g, axis=1) - out_dot_g) * r
                dv = w[:, None] * g + grad_dot[:, None] * q[None, :]
                if NORMALISE:
                    dv = dv - (grad_dot * logit * r / width)[:, None] * v
                tl.store(dv_ptr + offsets, dv.to(dv_ptr.dtype.element_ty), mask=mask)
                dq += tl.sum(grad_dot[:, None] * v, axis=0)
        tl.store(dq_partial_ptr + pid * width + cols, dq, mask=col_mask)

    _FORWARD, _BACKWARD = TritonKernel(_forward), TritonKernel(_backward)


def _stack_dtype(sources: list[torch.Tensor]) -> torch.dtype:
    """The dtype ``torch.stack`` gives the sources (bf16 when they all are; fp32 beside the fp32 embedding)."""
    return functools.reduce(torch.promote_types, (s.dtype for s in sources))


def _fused(query: torch.Tensor, sources: list[torch.Tensor]) -> bool:
    return triton_runs_on(query) and all(s.dtype != torch.float64 for s in sources)


@torch.library.custom_op("arch_plugins::depth_softmax", mutates_args=())
def _forward_op(query: torch.Tensor, sources: list[torch.Tensor], eps: float | None) -> torch.Tensor:
    if not _fused(query, sources):
        from arch_plugins.residuals.depth_softmax import depth_softmax_forward

        return depth_softmax_forward(query, eps, sources)[0].contiguous()
    width = query.shape[-1]
    values = torch.stack(sources).view(len(sources), -1, width)
    n_rows = values.shape[1]
    out = torch.empty(sources[0].shape, dtype=query.dtype, device=query.device)
    block_m, block_d, warps = row_tile(width)
    if n_rows:
        with on_device(query):
            _FORWARD[(cdiv(n_rows, block_m),)](values, query.contiguous(), out, len(sources), n_rows, width,
                                               0.0 if eps is None else eps, NORMALISE=eps is not None,
                                               BLOCK_M=block_m, BLOCK_D=block_d, num_warps=warps)
    return out


@_forward_op.register_fake
def _(query: torch.Tensor, sources: list[torch.Tensor], eps: float | None) -> torch.Tensor:
    return sources[0].new_empty(sources[0].shape, dtype=query.dtype)


@torch.library.custom_op("arch_plugins::depth_softmax_backward", mutates_args=())
def _backward_op(query: torch.Tensor, sources: list[torch.Tensor], grad: torch.Tensor,
                 eps: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(the query's gradient, the sources' gradients stacked (m, ..., d) in the stack's dtype)."""
    if not _fused(query, sources):
        from arch_plugins.residuals.depth_softmax import depth_softmax_backward, depth_softmax_forward

        _, weights, logits, inverse_rms = depth_softmax_forward(query, eps, sources)
        grad_query, grad_values = depth_softmax_backward(query, weights, logits, inverse_rms, sources, grad, True)
        return grad_query, grad_values.to(_stack_dtype(sources))
    width = query.shape[-1]
    values = torch.stack(sources).view(len(sources), -1, width)
    g = as_rows(grad)
    n_rows = values.shape[1]
    grad_values = torch.empty((len(sources), *sources[0].shape), dtype=values.dtype, device=values.device)
    block_m, block_d, warps = row_tile(width)
    n_tiles = cdiv(n_rows, block_m)
    programs = persistent_programs(query, n_tiles)
    partial = torch.zeros((programs, width), dtype=torch.float32, device=query.device)
    if n_rows:
        with on_device(query):
            _BACKWARD[(programs,)](values, query.contiguous(), g, grad_values, partial, len(sources), n_rows, width,
                                   g.stride(0), 0.0 if eps is None else eps, n_tiles, NORMALISE=eps is not None,
                                   BLOCK_M=block_m, BLOCK_D=block_d, num_warps=warps)
    return partial.sum(0).to(query.dtype), grad_values


@_backward_op.register_fake
def _(query: torch.Tensor, sources: list[torch.Tensor], grad: torch.Tensor,
      eps: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    return (query.new_empty(query.shape),
            sources[0].new_empty((len(sources), *sources[0].shape), dtype=_stack_dtype(sources)))


def _setup_context(ctx, inputs, output) -> None:
    query, sources, eps = inputs
    ctx.save_for_backward(query, *sources)  # the inputs only: the softmax is recomputed from them
    ctx.eps = eps


def _backward(ctx, grad: torch.Tensor):
    from arch_plugins.residuals.depth_softmax import per_source

    query, *sources = ctx.saved_tensors
    grad_query, grad_values = _backward_op(query, sources, grad, ctx.eps)
    return grad_query, per_source(grad_values, sources), None


_forward_op.register_autograd(_backward, setup_context=_setup_context)


def depth_softmax(query: torch.Tensor, sources: list[torch.Tensor], eps: float | None) -> torch.Tensor:
    """The fused op, as ``DepthSoftmax.apply(query, eps, *sources)``: sum_i softmax_i(u . v_i r_i) v_i."""
    return _forward_op(query, list(sources), eps)
