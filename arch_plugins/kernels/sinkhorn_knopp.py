"""mHC's Sinkhorn-Knopp projection as one fused op: every iteration of a token's n x n matrix in registers.

The torch path (``arch_plugins.residuals.manifold_hyper_connections.sinkhorn_knopp``) runs exp, then ``iters``
times a row and a column normalisation, each a sum, a clamp and a division: at the paper's 20 iterations about
120 forward kernels per sublayer, and its backward as many again, each over a (tokens, n, n) tensor of a few
hundred KB. Here one program holds ``BLOCK_T`` tokens' matrices, padded to a power of two, and runs them all
(Liger-Kernel's ``ops/mhc.py`` plan, written for this module's conventions):

    forward   m = exp(L - rowmax L);  iters times: m /= max(rowsum m, eps);  m /= max(colsum m, eps)
    backward  for each normalisation y = m / max(s, eps), last first:
              dm = (dy - [s >= eps] sum(dy * y)) / max(s, eps);   dL = dm(0) * exp(L - rowmax L)

Only the logits are saved. The backward recomputes the iterates instead of keeping them: to step back through
iteration k it runs the forward again from the start up to k, so it costs iters^2 / 2 iterations of arithmetic
on registers and no memory traffic beyond reading the logits and the gradient once and writing one gradient.
That is Liger's ``_mhc_sinkhorn_bwd_kernel`` choice too: at n = 4 the arithmetic is far cheaper than the bytes.

The op runs the Triton kernel on CUDA tensors (or anywhere in Triton's interpreter) and the torch path
elsewhere, and for float64 (whose precision the fp32 registers would lose); plugins choose it through
``dispatch.use_triton``.
"""

import torch

from arch_plugins.kernels.dispatch import TritonKernel, cdiv, next_power_of_2, on_device, triton_runs_on

try:
    import triton.language as tl
except Exception:  # triton is optional: dispatch refuses kernel: triton without it
    tl = None

if tl is not None:

    def _forward(logits_ptr, out_ptr, n_tokens, n, s_t, s_i, s_j, iters, eps,
                 BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr):
        tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        idx = tl.arange(0, BLOCK_N)
        mask = (tokens < n_tokens)[:, None, None] & (idx < n)[None, :, None] & (idx < n)[None, None, :]
        tokens = tokens.to(tl.int64)
        x = tl.load(logits_ptr + tokens[:, None, None] * s_t + idx[None, :, None] * s_i + idx[None, None, :] * s_j,
                    mask=mask, other=float("-inf")).to(tl.float32)
        row_max = tl.max(x, axis=2)
        # A padded row's maximum is -inf and its exp NaN: the where keeps the padding at 0, which every later
        # sum ignores and every division leaves at 0.
        start = tl.where(mask, tl.exp(x - row_max[:, :, None]), 0.0)
        dense = tokens[:, None, None] * n * n + idx[None, :, None] * n + idx[None, None, :]
        m = start
        for _ in range(iters):
            m = m / tl.maximum(tl.sum(m, axis=2), eps)[:, :, None]
            m = m / tl.maximum(tl.sum(m, axis=1), eps)[:, None, :]
        tl.store(out_ptr + dense, m.to(out_ptr.dtype.element_ty), mask=mask)

    def _backward(logits_ptr, grad_ptr, dlogits_ptr, n_tokens, n, s_t, s_i, s_j, g_t, g_i, g_j, iters, eps,
                  BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr):
        # The same load and start as the forward (a kernel can call only other jitted functions, and these are
        # built lazily: dispatch.TritonKernel).
        tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        idx = tl.arange(0, BLOCK_N)
        mask = (tokens < n_tokens)[:, None, None] & (idx < n)[None, :, None] & (idx < n)[None, None, :]
        tokens = tokens.to(tl.int64)
        x = tl.load(logits_ptr + tokens[:, None, None] * s_t + idx[None, :, None] * s_i + idx[None, None, :] * s_j,
                    mask=mask, other=float("-inf")).to(tl.float32)
        row_max = tl.max(x, axis=2)
        # A padded row's maximum is -inf and its exp NaN: the where keeps the padding at 0, which every later
        # sum ignores and every division leaves at 0.
        start = tl.where(mask, tl.exp(x - row_max[:, :, None]), 0.0)
        dense = tokens[:, None, None] * n * n + idx[None, :, None] * n + idx[None, None, :]
        g = tl.load(grad_ptr + tokens[:, None, None] * g_t + idx[None, :, None] * g_i + idx[None, None, :] * g_j,
                    mask=mask, other=0.0).to(tl.float32)
        for back in range(iters):
            # Iteration ``step``, recomputed from the start: no iterate is kept anywhere.
            step = iters - 1 - back
            m = start
            for _ in range(step):
                m = m / tl.maximum(tl.sum(m, axis=2), eps)[:, :, None]
                m = m / tl.maximum(tl.sum(m, axis=1), eps)[:, None, :]
            row_sum = tl.sum(m, axis=2)
            row_floored = tl.maximum(row_sum, eps)
            after_rows = m / row_floored[:, :, None]
            col_sum = tl.sum(after_rows, axis=1)
            col_floored = tl.maximum(col_sum, eps)
            after_cols = after_rows / col_floored[:, None, :]
            # The column step, then the row step; the clamp's gradient passes where the sum is at least eps.
            # The wheres keep the padding's gradient at 0: a column's term would reach its padded rows, whose
            # floored sums (eps) would grow it past float32 into inf * 0 = NaN.
            through = tl.where(col_sum >= eps, tl.sum(g * after_cols, axis=1), 0.0)
            g = tl.where(mask, (g - through[:, None, :]) / col_floored[:, None, :], 0.0)
            through = tl.where(row_sum >= eps, tl.sum(g * after_rows, axis=2), 0.0)
            g = tl.where(mask, (g - through[:, :, None]) / row_floored[:, :, None], 0.0)
        tl.store(dlogits_ptr + dense, (g * start).to(dlogits_ptr.dtype.element_ty), mask=mask)

    _FORWARD, _BACKWARD = TritonKernel(_forward), TritonKernel(_backward)


def _tile(n: int) -> tuple[int, int, int]:
    """(tokens per program, padded n, warps): about 256 matrix entries per program. A starting point, not tuned."""
    block_n = next_power_of_2(n)
    return max(1, 256 // (block_n * block_n)), block_n, 2


def _as_matrices(x: torch.Tensor) -> torch.Tensor:
    """(..., n, n) as (tokens, n, n): a view where the layout allows it (the logits are a slice of mHC's
    coefficient row), read through its strides."""
    return x.reshape(-1, x.shape[-2], x.shape[-1])


@torch.library.custom_op("arch_plugins::sinkhorn_knopp", mutates_args=())
def _forward_op(logits: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    if not triton_runs_on(logits):
        from arch_plugins.residuals.sinkhorn import sinkhorn_steps

        return sinkhorn_steps(logits, iters, eps, keep=False)[1].contiguous()
    x = _as_matrices(logits)
    n_tokens, n = x.shape[0], x.shape[-1]
    out = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
    block_t, block_n, warps = _tile(n)
    if n_tokens:
        with on_device(logits):
            _FORWARD[(cdiv(n_tokens, block_t),)](x, out, n_tokens, n, *x.stride(), iters, eps,
                                                 BLOCK_T=block_t, BLOCK_N=block_n, num_warps=warps)
    return out


@_forward_op.register_fake
def _(logits: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    return logits.new_empty(logits.shape)


@torch.library.custom_op("arch_plugins::sinkhorn_knopp_backward", mutates_args=())
def _backward_op(logits: torch.Tensor, grad: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    if not triton_runs_on(logits):
        from arch_plugins.residuals.sinkhorn import sinkhorn_knopp_backward

        return sinkhorn_knopp_backward(logits, grad, iters, eps).contiguous()
    x, g = _as_matrices(logits), _as_matrices(grad)
    n_tokens, n = x.shape[0], x.shape[-1]
    dlogits = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
    block_t, block_n, warps = _tile(n)
    if n_tokens:
        with on_device(logits):
            _BACKWARD[(cdiv(n_tokens, block_t),)](x, g, dlogits, n_tokens, n, *x.stride(), *g.stride(), iters, eps,
                                                  BLOCK_T=block_t, BLOCK_N=block_n, num_warps=warps)
    return dlogits


@_backward_op.register_fake
def _(logits: torch.Tensor, grad: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    return logits.new_empty(logits.shape)


def _setup_context(ctx, inputs, output) -> None:
    logits, iters, eps = inputs
    ctx.save_for_backward(logits)  # the logits only: the backward recomputes every iterate from them
    ctx.iters, ctx.eps = iters, eps


def _backward(ctx, grad: torch.Tensor):
    (logits,) = ctx.saved_tensors
    return _backward_op(logits, grad, ctx.iters, ctx.eps), None, None


_forward_op.register_autograd(_backward, setup_context=_setup_context)


def sinkhorn_knopp(logits: torch.Tensor, iters: int, eps: float = 1e-6) -> torch.Tensor:
    """The fused op: (..., n, n) logits to doubly stochastic matrices, as the residual's ``sinkhorn_knopp``."""
    return _forward_op(logits, iters, eps)


def sinkhorn_knopp_backward(logits: torch.Tensor, grad: torch.Tensor, iters: int, eps: float = 1e-6) -> torch.Tensor:
    """The fused backward op on its own: the logits' gradient given the output's, for a caller that runs the
    forward inside an autograd node of its own (mHC's coefficients and mix) and so differentiates it by hand."""
    return _backward_op(logits, grad, iters, eps)
