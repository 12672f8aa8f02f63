"""The fused Sinkhorn and depth-softmax kernels compile for a Hopper GPU (sm_90) without one.

Triton's interpreter runs a kernel's Python on numpy, and accepts code the compiler refuses (a call to a function
that is not jitted, a loop-carried value changing type, a shape no layout can hold). So each kernel is also
compiled here, ahead of time, down to a cubin by the ptxas that ships with triton, at the shapes the plugins
launch (n = 4 streams; width 1024 in bf16). It checks that they build, not how fast they run.
"""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from arch_plugins.kernels import depth_softmax, sinkhorn_knopp  # noqa: E402

HOPPER = GPUTarget("cuda", 90, 32)

SINKHORN = {"logits_ptr": "*fp32", "out_ptr": "*fp32", "n_tokens": "i32", "n": "i32", "s_t": "i32", "s_i": "i32",
            "s_j": "i32", "iters": "i32", "eps": "fp32", "BLOCK_T": "constexpr", "BLOCK_N": "constexpr"}
SINKHORN_BACKWARD = {"logits_ptr": "*fp32", "grad_ptr": "*fp32", "dlogits_ptr": "*fp32", "n_tokens": "i32", "n": "i32",
                     "s_t": "i32", "s_i": "i32", "s_j": "i32", "g_t": "i32", "g_i": "i32", "g_j": "i32",
                     "iters": "i32", "eps": "fp32", "BLOCK_T": "constexpr", "BLOCK_N": "constexpr"}
DEPTH = {"v_ptr": "*bf16", "q_ptr": "*fp32", "out_ptr": "*fp32", "n_sources": "i32", "n_rows": "i32", "width": "i32",
         "eps": "fp32", "NORMALISE": "constexpr", "BLOCK_M": "constexpr", "BLOCK_D": "constexpr"}
DEPTH_BACKWARD = {"v_ptr": "*bf16", "q_ptr": "*fp32", "g_ptr": "*fp32", "dv_ptr": "*bf16", "dq_partial_ptr": "*fp32",
                  "n_sources": "i32", "n_rows": "i32", "width": "i32", "g_stride": "i32", "eps": "fp32",
                  "n_tiles": "i32", "NORMALISE": "constexpr", "BLOCK_M": "constexpr", "BLOCK_D": "constexpr"}


def lower(kernel, signature: dict[str, str], constexprs: dict[str, object], warps: int):
    fn = triton.jit(kernel.fn)  # compiled mode, whatever TRITON_INTERPRET says (the op files build lazily)
    # The signature's order must be the kernel's: a renamed or reordered argument fails here, not on a GPU.
    assert list(signature) == fn.arg_names, (list(signature), fn.arg_names)
    return triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs), target=HOPPER,
                          options={"num_warps": warps})


def test_the_sinkhorn_kernels_compile_for_sm90():
    block_t, block_n, warps = sinkhorn_knopp._tile(4)
    for kernel, signature in ((sinkhorn_knopp._FORWARD, SINKHORN), (sinkhorn_knopp._BACKWARD, SINKHORN_BACKWARD)):
        compiled = lower(kernel, signature, {"BLOCK_T": block_t, "BLOCK_N": block_n}, warps)
        assert ".target sm_90" in compiled.asm["ptx"] and compiled.asm["cubin"]


@pytest.mark.parametrize("normalise", [True, False], ids=["key_norm", "no_key_norm"])
def test_the_depth_softmax_kernels_compile_for_sm90(normalise):
    from arch_plugins.kernels.dispatch import row_tile

    block_m, block_d, warps = row_tile(1024)
    for kernel, signature in ((depth_softmax._FORWARD, DEPTH), (depth_softmax._BACKWARD, DEPTH_BACKWARD)):
        compiled = lower(kernel, signature, {"NORMALISE": normalise, "BLOCK_M": block_m, "BLOCK_D": block_d}, warps)
        assert ".target sm_90" in compiled.asm["ptx"] and compiled.asm["cubin"]
