"""TokenFormer's Θ (``l2_norm_gelu``): S = GeLU(A * scale / (|A| + eps)) over each row of scores, one pass.

A is (tokens, n): each token's scores against the n key tokens. Eager, Θ reads and writes that tensor four or
five times (norm, divide, multiply, GeLU); here one program reads a row once and writes S once. ``scale`` is
sqrt(n) (or sqrt(n_old) after a function-preserving growth), read from a device tensor so that no host sync
happens. GeLU is the exact erf form (``F.gelu``'s default, TokenFormer's).

Backward, with r = |A|, f = scale / (r + eps), z = f A:
    dz = g GeLU'(z),  GeLU'(z) = Phi(z) + z phi(z)
    dA = f dz - scale / (r + eps)^2 * <dz, A> / r * A      (the second term is 0 where r = 0, as torch's norm)
Only A is saved (the scores, which the eager path keeps too); r, f, z are recomputed from it.

Output dtype: A's. Under bf16 autocast the eager Θ returns fp32 (the norm runs in fp32) and the next matmul
rounds it to bf16; writing bf16 here gives the matmul the same values at half the bytes.
"""

import torch

from arch_plugins.kernels.dispatch import TritonKernel, as_rows, cdiv, on_device, row_tile

try:
    import triton.language as tl
except Exception:  # triton is optional: dispatch refuses kernel: triton without it
    tl = None

if tl is not None:

    def _forward(a_ptr, scale_ptr, s_ptr, n_rows, n_cols, a_stride, eps, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.arange(0, BLOCK_N)
        mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
        rows = rows.to(tl.int64)
        a = tl.load(a_ptr + rows[:, None] * a_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        scale = tl.load(scale_ptr).to(tl.float32)
        f = scale / (tl.sqrt(tl.sum(a * a, axis=1)) + eps)
        z = a * f[:, None]
        s = 0.5 * z * (1.0 + tl.erf(z * 0.7071067811865476))  # 1/sqrt(2)
        tl.store(s_ptr + rows[:, None] * n_cols + cols[None, :], s.to(s_ptr.dtype.element_ty), mask=mask)

    def _backward(a_ptr, scale_ptr, g_ptr, da_ptr, n_rows, n_cols, a_stride, g_stride, eps,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.arange(0, BLOCK_N)
        mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
        rows = rows.to(tl.int64)
        a = tl.load(a_ptr + rows[:, None] * a_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        g = tl.load(g_ptr + rows[:, None] * g_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        scale = tl.load(scale_ptr).to(tl.float32)
        r = tl.sqrt(tl.sum(a * a, axis=1))
        f = scale / (r + eps)
        z = a * f[:, None]
        cdf = 0.5 * (1.0 + tl.erf(z * 0.7071067811865476))
        pdf = tl.exp(-0.5 * z * z) * 0.3989422804014327  # 1/sqrt(2 pi)
        dz = g * (cdf + z * pdf)
        # d f / d r = -scale / (r + eps)^2 and d r / d A = A / r (0 at r = 0, torch's subgradient).
        coef = tl.where(r > 0.0, f / (r + eps) * tl.sum(dz * a, axis=1) / tl.where(r > 0.0, r, 1.0), 0.0)
        da = f[:, None] * dz - a * coef[:, None]
        tl.store(da_ptr + rows[:, None] * n_cols + cols[None, :], da.to(da_ptr.dtype.element_ty), mask=mask)

    _FORWARD, _BACKWARD = TritonKernel(_forward), TritonKernel(_backward)


# torch.library custom ops (not an autograd.Function behind torch.compiler.disable): one opaque node in a
# torch.compile graph, no graph break; the fakes give the shapes.
@torch.library.custom_op("arch_plugins::pattention_theta", mutates_args=())
def _forward_op(scores: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    rows = as_rows(scores)
    n_rows, n_cols = rows.shape
    scale = scale.reshape(1).to(device=scores.device)
    s = torch.empty((n_rows, n_cols), dtype=scores.dtype, device=scores.device)
    block_m, block_n, warps = row_tile(n_cols)
    if n_rows:
        with on_device(scores):
            _FORWARD[(cdiv(n_rows, block_m),)](rows, scale, s, n_rows, n_cols, rows.stride(0), eps,
                                               BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps)
    return s.view(scores.shape)


@_forward_op.register_fake
def _(scores, scale, eps):
    return scores.new_empty(scores.shape)


@torch.library.custom_op("arch_plugins::pattention_theta_backward", mutates_args=())
def _backward_op(scores: torch.Tensor, scale: torch.Tensor, grad: torch.Tensor, eps: float) -> torch.Tensor:
    rows, g = as_rows(scores), as_rows(grad)
    n_rows, n_cols = rows.shape
    scale = scale.reshape(1).to(device=scores.device)
    da = torch.empty((n_rows, n_cols), dtype=scores.dtype, device=scores.device)
    block_m, block_n, warps = row_tile(n_cols)
    if n_rows:
        with on_device(scores):
            _BACKWARD[(cdiv(n_rows, block_m),)](rows, scale, g, da, n_rows, n_cols, rows.stride(0), g.stride(0),
                                                eps, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps)
    return da.view(scores.shape)


@_backward_op.register_fake
def _(scores, scale, grad, eps):
    return scores.new_empty(scores.shape)


def _setup_context(ctx, inputs, output) -> None:
    scores, scale, eps = inputs
    ctx.save_for_backward(scores, scale)  # only A: r, f, z are recomputed from it
    ctx.eps = eps


def _backward(ctx, grad: torch.Tensor):
    scores, scale = ctx.saved_tensors
    return _backward_op(scores, scale, grad, ctx.eps), None, None


_forward_op.register_autograd(_backward, setup_context=_setup_context)


def pattention_theta(scores: torch.Tensor, scale: float | torch.Tensor, eps: float) -> torch.Tensor:
    """GeLU(scores * scale / (|scores| + eps)) over the last dim with the Triton kernel. ``scale`` gets no
    gradient (it is a buffer). Callers decide through dispatch.use_triton."""
    if not isinstance(scale, torch.Tensor):
        scale = torch.tensor(float(scale), dtype=torch.float32)
    return _forward_op(scores, scale.detach(), eps)
