"""nGPT's stream update h <- Norm(lerp(h, Norm(b), a)) in one pass (a = |alpha|, per channel), fp32 statistics.

Unfused, the block runs the hypersphere's ``*_out`` site (Norm(b)), the ngpt residual's lerp, and the
``*_after_add`` site (Norm again): in eager mode about a dozen passes over (tokens, d). Here one program reads
a tile of rows of h and b once and writes the new stream and the normalised branch (which the block keeps in
``history.branches``, as the unfused path does).

Forward, per row (rb, rm are the inverse norms, clamped as ``l2_normalize``: 1/max(|.|, eps)):
    bn = b rb;  m = h + a (bn - h);  out = m rm
Backward, given g (for out) and gb (for bn, when something read the branch):
    dm = rm g - rm^3 m <g, m>          (no projection term where the clamp is active, equality included)
    dh = (1 - a) dm;  dbn = a dm + gb;  da = sum over rows of dm (bn - h)
    db = rb dbn - rb^3 b <dbn, b>
Saved: h, b and a (b at its own width: bf16 under autocast); m, rb, rm are recomputed from them. da is summed
per program over the rows it loops over, then across programs by torch.

Dtypes follow the eager path: the lerp runs in h's dtype (a is cast to it), out is at least fp32, bn at least
fp32; everything in between is fp32 here (for bf16 h the eager path rounds bn and m to bf16 first).
"""

import torch

from arch_plugins.kernels.dispatch import (
    TritonKernel,
    as_rows,
    cdiv,
    on_device,
    persistent_programs,
    promoted,
    row_tile,
)

try:
    import triton.language as tl
except Exception:  # triton is optional: dispatch refuses kernel: triton without it
    tl = None

if tl is not None:

    def _forward(h_ptr, b_ptr, a_ptr, out_ptr, bn_ptr, n_rows, n_cols, h_stride, b_stride, eps_b_sq, eps_h_sq,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.arange(0, BLOCK_N)
        col_mask = cols < n_cols
        mask = (rows < n_rows)[:, None] & col_mask[None, :]
        rows = rows.to(tl.int64)
        h = tl.load(h_ptr + rows[:, None] * h_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + rows[:, None] * b_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        a = tl.load(a_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
        rb = tl.rsqrt(tl.maximum(tl.sum(b * b, axis=1), eps_b_sq))
        bn = b * rb[:, None]
        m = h + a[None, :] * (bn - h)
        rm = tl.rsqrt(tl.maximum(tl.sum(m * m, axis=1), eps_h_sq))
        offsets = rows[:, None] * n_cols + cols[None, :]
        tl.store(out_ptr + offsets, (m * rm[:, None]).to(out_ptr.dtype.element_ty), mask=mask)
        tl.store(bn_ptr + offsets, bn.to(bn_ptr.dtype.element_ty), mask=mask)

    def _backward(h_ptr, b_ptr, a_ptr, g_ptr, gb_ptr, dh_ptr, db_ptr, da_partial_ptr, n_rows, n_cols,
                  h_stride, b_stride, g_stride, gb_stride, eps_b_sq, eps_h_sq, n_tiles,
                  HAS_BRANCH_GRAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        pid = tl.program_id(0)
        cols = tl.arange(0, BLOCK_N)
        col_mask = cols < n_cols
        a = tl.load(a_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
        da = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for tile in range(pid, n_tiles, tl.num_programs(0)):
            rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
            mask = (rows < n_rows)[:, None] & col_mask[None, :]
            rows = rows.to(tl.int64)
            h = tl.load(h_ptr + rows[:, None] * h_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            b = tl.load(b_ptr + rows[:, None] * b_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            g = tl.load(g_ptr + rows[:, None] * g_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            b_sq = tl.sum(b * b, axis=1)
            rb = tl.rsqrt(tl.maximum(b_sq, eps_b_sq))
            bn = b * rb[:, None]
            m = h + a[None, :] * (bn - h)
            m_sq = tl.sum(m * m, axis=1)
            rm = tl.rsqrt(tl.maximum(m_sq, eps_h_sq))
            proj_m = tl.where(m_sq > eps_h_sq, rm * rm * rm * tl.sum(g * m, axis=1), 0.0)
            dm = g * rm[:, None] - m * proj_m[:, None]
            da += tl.sum(dm * (bn - h), axis=0)
            dbn = dm * a[None, :]
            if HAS_BRANCH_GRAD:
                gb = tl.load(gb_ptr + rows[:, None] * gb_stride + cols[None, :], mask=mask, other=0.0)
                dbn += gb.to(tl.float32)
            proj_b = tl.where(b_sq > eps_b_sq, rb * rb * rb * tl.sum(dbn * b, axis=1), 0.0)
            db = dbn * rb[:, None] - b * proj_b[:, None]
            offsets = rows[:, None] * n_cols + cols[None, :]
            tl.store(dh_ptr + offsets, (dm - a[None, :] * dm).to(dh_ptr.dtype.element_ty), mask=mask)
            tl.store(db_ptr + offsets, db.to(db_ptr.dtype.element_ty), mask=mask)
        tl.store(da_partial_ptr + pid * n_cols + cols, da, mask=col_mask)

    _FORWARD, _BACKWARD = TritonKernel(_forward), TritonKernel(_backward)


def _check_shapes(h: torch.Tensor, b: torch.Tensor, a: torch.Tensor) -> None:
    if h.shape != b.shape or a.shape != h.shape[-1:]:
        raise ValueError(f"stream {tuple(h.shape)}, branch {tuple(b.shape)} and alpha {tuple(a.shape)} "
                         f"do not fit (alpha is one value per channel)")


# torch.library custom ops (not an autograd.Function behind torch.compiler.disable): one opaque node in a
# torch.compile graph, no graph break; the fakes give the shapes.
@torch.library.custom_op("arch_plugins::ngpt_stream_update", mutates_args=())
def _forward_op(h: torch.Tensor, b: torch.Tensor, alpha: torch.Tensor, eps_branch: float,
                eps_stream: float) -> tuple[torch.Tensor, torch.Tensor]:
    _check_shapes(h, b, alpha)
    h_rows, b_rows = as_rows(h), as_rows(b)
    a = alpha.to(h.dtype).contiguous()  # the eager lerp's weight is cast to the stream's dtype
    n_rows, n_cols = h_rows.shape
    out = torch.empty((n_rows, n_cols), dtype=promoted(h.dtype), device=h.device)
    bn = torch.empty((n_rows, n_cols), dtype=promoted(b.dtype), device=b.device)
    block_m, block_n, warps = row_tile(n_cols)
    if n_rows:
        with on_device(h):
            _FORWARD[(cdiv(n_rows, block_m),)](h_rows, b_rows, a, out, bn, n_rows, n_cols, h_rows.stride(0),
                                               b_rows.stride(0), eps_branch ** 2, eps_stream ** 2,
                                               BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps)
    return out.view(h.shape), bn.view(b.shape)


@_forward_op.register_fake
def _(h, b, alpha, eps_branch, eps_stream):
    _check_shapes(h, b, alpha)
    return h.new_empty(h.shape, dtype=promoted(h.dtype)), b.new_empty(b.shape, dtype=promoted(b.dtype))


@torch.library.custom_op("arch_plugins::ngpt_stream_update_backward", mutates_args=())
def _backward_op(h: torch.Tensor, b: torch.Tensor, alpha: torch.Tensor, grad_out: torch.Tensor,
                 grad_branch: torch.Tensor | None, eps_branch: float,
                 eps_stream: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    h_rows, b_rows, g = as_rows(h), as_rows(b), as_rows(grad_out)
    a = alpha.to(h.dtype).contiguous()
    gb = as_rows(grad_branch) if grad_branch is not None else g  # g: a valid pointer the kernel never reads
    n_rows, n_cols = h_rows.shape
    dh = torch.empty((n_rows, n_cols), dtype=h.dtype, device=h.device)
    db = torch.empty((n_rows, n_cols), dtype=b.dtype, device=b.device)
    block_m, block_n, warps = row_tile(n_cols)
    tiles = cdiv(n_rows, block_m)
    programs = persistent_programs(h_rows, tiles)
    da_partial = torch.zeros((programs, n_cols), dtype=torch.float32, device=h.device)
    if n_rows:
        with on_device(h):
            _BACKWARD[(programs,)](h_rows, b_rows, a, g, gb, dh, db, da_partial, n_rows, n_cols,
                                   h_rows.stride(0), b_rows.stride(0), g.stride(0), gb.stride(0),
                                   eps_branch ** 2, eps_stream ** 2, tiles,
                                   HAS_BRANCH_GRAD=grad_branch is not None, BLOCK_M=block_m, BLOCK_N=block_n,
                                   num_warps=warps)
    da = da_partial.sum(0).to(h.dtype).to(alpha.dtype)  # via h's dtype, as the eager lerp
    return dh.view(h.shape), db.view(b.shape), da


@_backward_op.register_fake
def _(h, b, alpha, grad_out, grad_branch, eps_branch, eps_stream):
    return h.new_empty(h.shape), b.new_empty(b.shape), alpha.new_empty(alpha.shape)


def _setup_context(ctx, inputs, output) -> None:
    h, b, alpha, eps_branch, eps_stream = inputs
    # Only the inputs (b at its own width: bf16 under autocast); m, rb, rm are recomputed from them.
    ctx.save_for_backward(h, b, alpha)
    ctx.eps = (eps_branch, eps_stream)
    ctx.set_materialize_grads(False)  # the branch output usually gets no gradient: skip its zeros


def _backward(ctx, grad_out: torch.Tensor | None, grad_branch: torch.Tensor | None):
    h, b, alpha = ctx.saved_tensors
    if grad_out is None:
        grad_out = torch.zeros(h.shape, dtype=promoted(h.dtype), device=h.device)
    dh, db, da = _backward_op(h, b, alpha, grad_out, grad_branch, *ctx.eps)
    return dh, db, da, None, None


_forward_op.register_autograd(_backward, setup_context=_setup_context)


def ngpt_stream_update(h: torch.Tensor, branch: torch.Tensor, alpha: torch.Tensor, eps_branch: float,
                       eps_stream: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(Norm(lerp(h, Norm(branch), alpha)), Norm(branch)) with the Triton kernel; alpha is used as given (pass
    |alpha| for NVIDIA's reference). Callers decide through dispatch.use_triton."""
    return _forward_op(h, branch, alpha, eps_branch, eps_stream)
