"""Checks shared by the kernel tests: each Triton op against the eager path it replaces, outputs and gradients.

Used at tiny shapes in Triton's CPU interpreter (tests/kernels_interpreted.py) and at real shapes on a GPU
(tests/test_kernels.py). Tolerances: fp32 within 1e-5 (relative and absolute); bf16 within 2^-6 of the
largest eager value (about two bf16 roundings), since the kernels keep every intermediate in fp32 where the
eager path rounds some of them (the lerp in the stream's dtype; Θ's norm and product outside autocast) to bf16.
"""

from __future__ import annotations

import torch

from arch_plugins.norms.hypersphere import l2_normalize
from arch_plugins.projections.pattention import theta


def assert_matches(got: torch.Tensor, expected: torch.Tensor, low_precision: bool) -> None:
    assert got.shape == expected.shape and got.dtype == expected.dtype, (got.shape, got.dtype, expected.dtype)
    if low_precision:
        torch.testing.assert_close(got.double(), expected.double(), rtol=0,
                                   atol=2 ** -6 * expected.double().abs().max().item())
    else:
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def compare(kernel_fn, eager_fn, inputs: list[torch.Tensor], low_precision: bool, seed: int = 0) -> None:
    """Run both on copies of ``inputs``; compare every output and the gradient of every input that has one.

    The output gradients are drawn in logical order, not memory order, so both paths get the same ones whatever
    layout their outputs have.
    """
    results = []
    for fn in (kernel_fn, eager_fn):
        leaves = [same_layout_copy(x).requires_grad_(x.requires_grad) for x in inputs]
        outputs = fn(*leaves)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        g = torch.Generator(device=outputs[0].device).manual_seed(seed)
        grads = [torch.randn(o.shape, generator=g, device=o.device).to(o.dtype) for o in outputs]
        torch.autograd.backward(outputs, grads)
        results.append((outputs, [x.grad for x in leaves if x.requires_grad]))
    (got_out, got_grad), (exp_out, exp_grad) = results
    for got, expected in zip(got_out + tuple(got_grad), exp_out + tuple(exp_grad), strict=True):
        assert_matches(got, expected, low_precision)


def same_layout_copy(x: torch.Tensor) -> torch.Tensor:
    """A leaf copy of ``x`` with its strides, also where they are not dense (clone() would make it contiguous)."""
    y = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
    y.copy_(x.detach())
    assert y.stride() == x.stride()
    return y


def strided(shape: tuple[int, ...], dtype: torch.dtype, device: str = "cpu", seed: int = 0) -> torch.Tensor:
    """A non-contiguous tensor of ``shape``: every other row of a larger tensor stored feature-major."""
    g = torch.Generator(device=device).manual_seed(seed)
    *lead, width = shape
    big = torch.randn(width, *lead[:-1], 2 * lead[-1], generator=g, device=device).to(dtype)
    x = big.movedim(0, -1)[..., ::2, :]
    assert x.shape == shape and not x.is_contiguous()
    return x


def eager_stream_update(h, b, alpha, eps_b, eps_h):
    """The unfused block: the hypersphere's *_out site, the ngpt residual's lerp, the *_after_add site."""
    bn = l2_normalize(b, eps_b)
    return l2_normalize(torch.lerp(h, bn.to(h.dtype), alpha.to(h.dtype)), eps_h), bn


def check_row_l2_normalize(shape, dtype, device="cpu") -> None:
    from arch_plugins.kernels.row_l2_normalize import row_l2_normalize

    x = strided(shape, dtype, device).requires_grad_()
    compare(lambda x: row_l2_normalize(x, 1e-12), lambda x: l2_normalize(x, 1e-12), [x], dtype != torch.float32)


def check_qk_normalize(batch, heads, time, head_dim, dtype, device="cpu") -> None:
    from arch_plugins.kernels.qk_normalize import qk_normalize

    g = torch.Generator(device=device).manual_seed(1)
    # The block's layout: q and k are permuted views of the fused qkv projection's output.
    qkv = torch.randn(batch, time, 3, heads, head_dim, generator=g, device=device).to(dtype)
    q, k, _ = qkv.permute(2, 0, 3, 1, 4)
    assert not q.is_contiguous()
    s = (torch.rand(heads, head_dim, generator=g, device=device) + 0.5).requires_grad_()
    eager = lambda q, k, s: (l2_normalize(q, 1e-12) * s.square().view(heads, 1, head_dim), l2_normalize(k, 1e-12))
    compare(lambda q, k, s: qk_normalize(q, k, s.square(), 1e-12), eager,
            [q.requires_grad_(), k.requires_grad_(), s], dtype != torch.float32)


def check_ngpt_stream_update(shape, stream_dtype, branch_dtype, device="cpu", branch_grad: bool = True) -> None:
    from arch_plugins.kernels.ngpt_stream_update import ngpt_stream_update

    g = torch.Generator(device=device).manual_seed(2)
    h = l2_normalize(torch.randn(shape, generator=g, device=device)).to(stream_dtype).requires_grad_()
    b = strided(shape, branch_dtype, device, seed=3).requires_grad_()
    # Some entries negative: the step size is |alpha|, NVIDIA's reference.
    alpha = (torch.rand(shape[-1], generator=g, device=device) - 0.2).requires_grad_()
    low = torch.bfloat16 in (stream_dtype, branch_dtype)
    kernel = lambda h, b, a: ngpt_stream_update(h, b, a.abs(), 1e-12, 1e-12)
    eager = lambda h, b, a: eager_stream_update(h, b, a.abs(), 1e-12, 1e-12)
    if branch_grad:
        compare(kernel, eager, [h, b, alpha], low)
    else:  # the block's usual case: only the diagnostics read the normalised branch, under no_grad
        compare(lambda *x: kernel(*x)[0], lambda *x: eager(*x)[0], [h, b, alpha], low)


def check_pattention_theta(shape, dtype, device="cpu") -> None:
    from arch_plugins.kernels.pattention_theta import pattention_theta

    scores = strided(shape, dtype, device).requires_grad_()
    # sqrt(n_old) as after a function-preserving growth, not sqrt(n): the scale is an input, not derived.
    scale = torch.tensor(max(1, shape[-1] - 7), dtype=torch.float32, device=device).sqrt()
    compare(lambda a: pattention_theta(a, scale, 1e-5), lambda a: theta(a, "l2_norm_gelu", scale, 1e-5),
            [scores], dtype != torch.float32)


def check_sinkhorn_knopp(tokens: tuple[int, ...], n: int, iters: int, device="cpu", scale: float = 3.0) -> None:
    """The fused Sinkhorn against the residual's torch path, fp32, on logits laid out as mHC slices them out of its
    coefficient row (a non-contiguous view)."""
    from arch_plugins.kernels.sinkhorn_knopp import sinkhorn_knopp as fused
    from arch_plugins.residuals.manifold_hyper_connections import sinkhorn_knopp

    g = torch.Generator(device=device).manual_seed(4)
    row = torch.randn(*tokens, n * n + 2 * n, generator=g, device=device) * scale
    logits = row[..., 2 * n:].unflatten(-1, (n, n))
    assert not logits.is_contiguous()
    compare(lambda x: fused(x, iters), lambda x: sinkhorn_knopp(x, iters), [logits.requires_grad_()], False)


def check_depth_softmax(shape: tuple[int, ...], dtypes: list[torch.dtype], eps: float | None, device="cpu") -> None:
    """The fused depth softmax against ``DepthSoftmax`` (the torch path): output, the query's and every source's
    gradient. Sources in ``dtypes`` (the embedding fp32 and bf16 sublayer outputs under autocast); fp32 query.

    fp32 sources within 1e-5; with a bf16 source the gradients are rounded to bf16 on both paths, from fp32 values
    that differ in their last bits, so they may land one bf16 step apart: 2^-6 of the largest, as the other ops."""
    from arch_plugins.kernels.depth_softmax import depth_softmax
    from arch_plugins.residuals.attnres import DepthSoftmax

    g = torch.Generator(device=device).manual_seed(6)
    sources = [torch.randn(shape, generator=g, device=device).to(dtype).requires_grad_() for dtype in dtypes]
    query = (torch.randn(shape[-1], generator=g, device=device) * 0.5).requires_grad_()
    compare(lambda q, *s: depth_softmax(q, list(s), eps), lambda q, *s: DepthSoftmax.apply(q, eps, *s),
            [query, *sources], torch.bfloat16 in dtypes)


def fused_op_samples():
    """The Sinkhorn and depth-softmax ops' samples (in the interpreter, and on the torch path in
    tests/test_kernels_fused_ops.py)."""
    from arch_plugins.kernels import depth_softmax, sinkhorn_knopp

    g = torch.Generator().manual_seed(7)
    row = torch.randn(2, 3, 4 * 4 + 8, generator=g)
    sources = [torch.randn(2, 3, 9, generator=g).requires_grad_() for _ in range(3)]
    return [
        (sinkhorn_knopp._forward_op, (row[..., 8:].unflatten(-1, (4, 4)).requires_grad_(), 3, 1e-6)),
        (depth_softmax._forward_op, (torch.randn(9, generator=g).requires_grad_(), sources, 1e-6)),
    ]
