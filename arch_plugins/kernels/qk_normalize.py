"""nGPT's q/k normalisation per head: q <- s^2 * q/|q|, k <- k/|k| (s = s_qk, one value per head and channel).

The same attention logits as the paper's (s q^).(s k^) with one multiply less (see ``QKNormScale``). q and k
arrive as (B, H, T, head_dim) with any strides (a permuted view of the fused qkv projection, or RoPE's output),
so the kernel indexes batch, head and time by their own strides and writes contiguous outputs. One kernel, run
once for q (with the scale) and once for k (without).

Backward for q (y = s2 * x r): gy = s2 g; dx = r gy - r^3 x <gy, x>; ds2 = sum over batch and time of g x r.
For k the same without s2. The programs of the q backward each own one (batch, head) and a share of its time
steps, so ds2's partial sums are per head: (B, H, splits, head_dim), summed by torch.
"""

import torch

from arch_plugins.kernels.dispatch import TritonKernel, cdiv, next_power_of_2, on_device, promoted

try:
    import triton.language as tl
except Exception:  # triton is optional: dispatch refuses kernel: triton without it
    tl = None

if tl is not None:

    def _forward(x_ptr, s2_ptr, y_ptr, n_heads, n_time, head_dim, stride_b, stride_h, stride_t, eps_sq,
                 HAS_SCALE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
        batch_head = tl.program_id(0)
        batch, head = batch_head // n_heads, batch_head % n_heads
        time = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
        cols = tl.arange(0, BLOCK_D)
        col_mask = cols < head_dim
        mask = (time < n_time)[:, None] & col_mask[None, :]
        time = time.to(tl.int64)
        base = batch.to(tl.int64) * stride_b + head.to(tl.int64) * stride_h
        x = tl.load(x_ptr + base + time[:, None] * stride_t + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        r = tl.rsqrt(tl.maximum(tl.sum(x * x, axis=1), eps_sq))
        y = x * r[:, None]
        if HAS_SCALE:
            s2 = tl.load(s2_ptr + head * head_dim + cols, mask=col_mask, other=0.0).to(tl.float32)
            y = y * s2[None, :]
        out = batch_head.to(tl.int64) * n_time * head_dim + time[:, None] * head_dim + cols[None, :]
        tl.store(y_ptr + out, y.to(y_ptr.dtype.element_ty), mask=mask)

    def _backward(x_ptr, s2_ptr, g_ptr, dx_ptr, ds2_partial_ptr, n_heads, n_time, head_dim,
                  stride_b, stride_h, stride_t, g_stride_b, g_stride_h, g_stride_t, eps_sq, n_splits,
                  HAS_SCALE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
        batch_head, split = tl.program_id(0), tl.program_id(1)
        batch, head = batch_head // n_heads, batch_head % n_heads
        cols = tl.arange(0, BLOCK_D)
        col_mask = cols < head_dim
        base = batch.to(tl.int64) * stride_b + head.to(tl.int64) * stride_h
        g_base = batch.to(tl.int64) * g_stride_b + head.to(tl.int64) * g_stride_h
        s2 = tl.full((BLOCK_D,), 1.0, dtype=tl.float32)
        if HAS_SCALE:
            s2 = tl.load(s2_ptr + head * head_dim + cols, mask=col_mask, other=0.0).to(tl.float32)
        ds2 = tl.zeros((BLOCK_D,), dtype=tl.float32)
        for tile in range(split, tl.cdiv(n_time, BLOCK_T), n_splits):
            time = tile * BLOCK_T + tl.arange(0, BLOCK_T)
            mask = (time < n_time)[:, None] & col_mask[None, :]
            time = time.to(tl.int64)
            x = tl.load(x_ptr + base + time[:, None] * stride_t + cols[None, :], mask=mask, other=0.0)
            x = x.to(tl.float32)
            g = tl.load(g_ptr + g_base + time[:, None] * g_stride_t + cols[None, :], mask=mask, other=0.0)
            g = g.to(tl.float32)
            x_sq = tl.sum(x * x, axis=1)
            r = tl.rsqrt(tl.maximum(x_sq, eps_sq))
            if HAS_SCALE:
                ds2 += tl.sum(g * x * r[:, None], axis=0)
            gy = g * s2[None, :]
            proj = tl.where(x_sq > eps_sq, r * r * r * tl.sum(gy * x, axis=1), 0.0)
            dx = gy * r[:, None] - x * proj[:, None]
            out = batch_head.to(tl.int64) * n_time * head_dim + time[:, None] * head_dim + cols[None, :]
            tl.store(dx_ptr + out, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        if HAS_SCALE:
            tl.store(ds2_partial_ptr + (batch_head * n_splits + split) * head_dim + cols, ds2, mask=col_mask)

    _FORWARD, _BACKWARD = TritonKernel(_forward), TritonKernel(_backward)


def _unit_last_stride(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _tile(head_dim: int, n_time: int) -> tuple[int, int, int]:
    block_d = next_power_of_2(head_dim)
    block_t = max(1, min(next_power_of_2(n_time), 4096 // block_d))
    return block_t, block_d, min(8, max(4, block_t * block_d // 512))


def _normalize(x: torch.Tensor, s2: torch.Tensor | None, eps: float, out_dtype: torch.dtype) -> torch.Tensor:
    B, H, T, D = x.shape
    y = torch.empty((B, H, T, D), dtype=out_dtype, device=x.device)
    block_t, block_d, warps = _tile(D, T)
    if y.numel():
        with on_device(x):
            _FORWARD[(B * H, cdiv(T, block_t))](x, s2 if s2 is not None else x, y, H, T, D, *x.stride()[:3],
                                                eps * eps, HAS_SCALE=s2 is not None, BLOCK_T=block_t,
                                                BLOCK_D=block_d, num_warps=warps)
    return y


def _normalize_backward(x: torch.Tensor, s2: torch.Tensor | None, grad: torch.Tensor, eps: float):
    B, H, T, D = x.shape
    g = _unit_last_stride(grad)
    dx = torch.empty((B, H, T, D), dtype=x.dtype, device=x.device)
    block_t, block_d, warps = _tile(D, T)
    # Enough programs to fill the GPU when B*H is small, each looping over its share of the time tiles.
    splits = max(1, min(cdiv(T, block_t), cdiv(512, max(1, B * H)))) if x.is_cuda else min(2, cdiv(T, block_t))
    partial = torch.zeros((B, H, splits, D), dtype=torch.float32, device=x.device)
    if dx.numel():
        with on_device(x):
            _BACKWARD[(B * H, splits)](x, s2 if s2 is not None else x, g, dx, partial, H, T, D, *x.stride()[:3],
                                       *g.stride()[:3], eps * eps, splits, HAS_SCALE=s2 is not None,
                                       BLOCK_T=block_t, BLOCK_D=block_d, num_warps=warps)
    return dx, (partial.sum((0, 2)) if s2 is not None else None)


def _check_shapes(q: torch.Tensor, k: torch.Tensor, s2: torch.Tensor) -> None:
    if q.dim() != 4 or k.shape != q.shape or s2.shape != (q.shape[1], q.shape[3]):
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must be (B, H, T, head_dim) and the "
                         f"scale (H, head_dim), got {tuple(s2.shape)}")


def _out_dtypes(q: torch.Tensor, k: torch.Tensor, s2: torch.Tensor) -> tuple[torch.dtype, torch.dtype]:
    # The eager path's dtypes: normalised q times the (fp32) scale, normalised k at least fp32.
    return torch.promote_types(promoted(q.dtype), s2.dtype), promoted(k.dtype)


# torch.library custom ops (not an autograd.Function behind torch.compiler.disable): one opaque node in a
# torch.compile graph, no graph break; the fakes give the shapes.
@torch.library.custom_op("arch_plugins::qk_normalize", mutates_args=())
def _forward_op(q: torch.Tensor, k: torch.Tensor, s2: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    _check_shapes(q, k, s2)
    q_dtype, k_dtype = _out_dtypes(q, k, s2)
    return (_normalize(_unit_last_stride(q), s2.contiguous(), eps, q_dtype),
            _normalize(_unit_last_stride(k), None, eps, k_dtype))


@_forward_op.register_fake
def _(q, k, s2, eps):
    _check_shapes(q, k, s2)
    q_dtype, k_dtype = _out_dtypes(q, k, s2)
    return q.new_empty(q.shape, dtype=q_dtype), k.new_empty(k.shape, dtype=k_dtype)


@torch.library.custom_op("arch_plugins::qk_normalize_backward_q", mutates_args=())
def _backward_q_op(q: torch.Tensor, s2: torch.Tensor, grad: torch.Tensor,
                   eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    dq, ds2 = _normalize_backward(_unit_last_stride(q), s2.contiguous(), grad, eps)
    return dq, ds2.to(s2.dtype)


@_backward_q_op.register_fake
def _(q, s2, grad, eps):
    return q.new_empty(q.shape), s2.new_empty(s2.shape)


@torch.library.custom_op("arch_plugins::qk_normalize_backward_k", mutates_args=())
def _backward_k_op(k: torch.Tensor, grad: torch.Tensor, eps: float) -> torch.Tensor:
    return _normalize_backward(_unit_last_stride(k), None, grad, eps)[0]


@_backward_k_op.register_fake
def _(k, grad, eps):
    return k.new_empty(k.shape)


def _setup_context(ctx, inputs, output) -> None:
    q, k, s2, eps = inputs
    ctx.save_for_backward(q, k, s2)
    ctx.eps = eps
    ctx.set_materialize_grads(False)  # eager autograd: an output nothing differentiates costs no zeros


def _backward(ctx, grad_q: torch.Tensor | None, grad_k: torch.Tensor | None):
    q, k, s2 = ctx.saved_tensors
    dq = dk = ds2 = None
    if grad_q is not None:
        dq, ds2 = _backward_q_op(q, s2, grad_q, ctx.eps)
    if grad_k is not None:
        dk = _backward_k_op(k, grad_k, ctx.eps)
    return dq, dk, ds2, None


_forward_op.register_autograd(_backward, setup_context=_setup_context)


def qk_normalize(q: torch.Tensor, k: torch.Tensor, s2: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(s2 * q/|q|, k/|k|) per head with the Triton kernel; q, k (B, H, T, head_dim), s2 (H, head_dim).
    Callers decide through dispatch.use_triton."""
    return _forward_op(q, k, s2, eps)
