"""Row L2 normalisation x / max(|x|, eps) over the last dim, fp32 statistics, as one read and one write.

The eager path (``arch_plugins.norms.hypersphere.l2_normalize``) casts to fp32, squares, sums, clamps, takes
rsqrt and multiplies: five passes over the row in eager mode. Here one program holds whole rows in registers.
Output dtype: at least fp32, as the eager path's (the nGPT stream stays fp32 under bf16 autocast).

Backward (y = x r, r = 1/max(|x|, eps)): dx = r g - r^3 x <g, x> where |x| > eps, dx = r g where the clamp
is active, at equality too (then r is the constant 1/eps). Only x is saved; r is recomputed from it in the same read.
"""

import torch

from arch_plugins.kernels.dispatch import TritonKernel, as_rows, cdiv, on_device, promoted, row_tile

try:
    import triton.language as tl
except Exception:  # triton is optional: dispatch refuses kernel: triton without it
    tl = None

if tl is not None:

    def _forward(x_ptr, y_ptr, n_rows, n_cols, x_stride, eps_sq, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.arange(0, BLOCK_N)
        mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
        rows = rows.to(tl.int64)
        x = tl.load(x_ptr + rows[:, None] * x_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        r = tl.rsqrt(tl.maximum(tl.sum(x * x, axis=1), eps_sq))
        y = x * r[:, None]
        tl.store(y_ptr + rows[:, None] * n_cols + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)

    def _backward(x_ptr, g_ptr, dx_ptr, n_rows, n_cols, x_stride, g_stride, eps_sq,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.arange(0, BLOCK_N)
        mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
        rows = rows.to(tl.int64)
        x = tl.load(x_ptr + rows[:, None] * x_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        g = tl.load(g_ptr + rows[:, None] * g_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        sum_sq = tl.sum(x * x, axis=1)
        r = tl.rsqrt(tl.maximum(sum_sq, eps_sq))
        # The clamp's gradient passes where sum_sq > eps^2 (torch's clamp_min: none at equality), else r is a constant.
        proj = tl.where(sum_sq > eps_sq, r * r * r * tl.sum(g * x, axis=1), 0.0)
        dx = g * r[:, None] - x * proj[:, None]
        tl.store(dx_ptr + rows[:, None] * n_cols + cols[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)

    _FORWARD, _BACKWARD = TritonKernel(_forward), TritonKernel(_backward)


# A torch.library custom op, not an autograd.Function behind torch.compiler.disable: torch.compile sees it as one
# opaque node (Inductor does not re-fuse through its casts) and keeps the graph whole, shapes from the fake.
@torch.library.custom_op("arch_plugins::row_l2_normalize", mutates_args=())
def _forward_op(x: torch.Tensor, eps: float) -> torch.Tensor:
    rows = as_rows(x)
    n_rows, n_cols = rows.shape
    y = torch.empty((n_rows, n_cols), dtype=promoted(x.dtype), device=x.device)
    block_m, block_n, warps = row_tile(n_cols)
    if n_rows:
        with on_device(x):
            _FORWARD[(cdiv(n_rows, block_m),)](rows, y, n_rows, n_cols, rows.stride(0), eps * eps,
                                               BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps)
    return y.view(x.shape)


@_forward_op.register_fake
def _(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x.new_empty(x.shape, dtype=promoted(x.dtype))


@torch.library.custom_op("arch_plugins::row_l2_normalize_backward", mutates_args=())
def _backward_op(x: torch.Tensor, grad: torch.Tensor, eps: float) -> torch.Tensor:
    rows, g = as_rows(x), as_rows(grad)
    n_rows, n_cols = rows.shape
    dx = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    block_m, block_n, warps = row_tile(n_cols)
    if n_rows:
        with on_device(x):
            _BACKWARD[(cdiv(n_rows, block_m),)](rows, g, dx, n_rows, n_cols, rows.stride(0), g.stride(0), eps * eps,
                                                BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps)
    return dx.view(x.shape)


@_backward_op.register_fake
def _(x: torch.Tensor, grad: torch.Tensor, eps: float) -> torch.Tensor:
    return x.new_empty(x.shape)


def _setup_context(ctx, inputs, output) -> None:
    x, eps = inputs
    ctx.save_for_backward(x)  # only the input: the row statistics are recomputed from it in the same read
    ctx.eps = eps


def _backward(ctx, grad: torch.Tensor):
    (x,) = ctx.saved_tensors
    return _backward_op(x, grad, ctx.eps), None


_forward_op.register_autograd(_backward, setup_context=_setup_context)


def row_l2_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / max(|x|, eps) over the last dim with the Triton kernel (callers decide through dispatch.use_triton)."""
    return _forward_op(x, eps)
