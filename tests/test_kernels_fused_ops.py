"""The fused Sinkhorn-Knopp and depth-softmax ops' registrations, on their torch path (no interpreter, no GPU).

Each op (arch_plugins/kernels/sinkhorn_knopp.py, depth_softmax.py) carries the residual's torch code as its path
off CUDA, so its fake and autograd registrations are checked here in the default run, quickly: opcheck, a
fullgraph compile that traces through the fake, and equality with the residuals' own autograd.Functions. The
Triton kernels themselves are checked in the interpreter (tests/kernels_interpreted.py) and on CUDA
(tests/test_kernels.py).
"""

from __future__ import annotations

import pytest
import torch

from arch_plugins import registry
from arch_plugins.kernels import dispatch
from arch_plugins.kernels.depth_softmax import depth_softmax
from arch_plugins.kernels.sinkhorn_knopp import sinkhorn_knopp as fused_sinkhorn_knopp
from arch_plugins.registry import PluginError
from arch_plugins.residuals.attnres import DepthSoftmax
from arch_plugins.residuals.manifold_hyper_connections import sinkhorn_knopp
from tests.kernel_checks import compare, fused_op_samples

if dispatch.interpreting():
    pytest.skip("the torch path's checks: run without TRITON_INTERPRET", allow_module_level=True)


@pytest.mark.parametrize("index", [0, 1], ids=["sinkhorn_knopp", "depth_softmax"])
def test_each_fused_op_passes_torch_library_opcheck(index):
    """Schema, the fake against the real op (shapes, dtypes, strides), the autograd registration, AOT dispatch."""
    op, args = fused_op_samples()[index]
    torch.library.opcheck(op, args)


def test_the_sinkhorn_op_equals_the_residuals_autograd_function():
    logits = (torch.randn(3, 5, 4 * 4 + 8, generator=torch.Generator().manual_seed(0)) * 3)[..., 8:]
    logits = logits.unflatten(-1, (4, 4)).requires_grad_()
    compare(lambda x: fused_sinkhorn_knopp(x, 20), lambda x: sinkhorn_knopp(x, 20), [logits], False)


@pytest.mark.parametrize("eps", [1e-6, None])
def test_the_depth_softmax_op_equals_the_residuals_autograd_function(eps):
    # The embedding in fp32 beside bf16 sublayer outputs, as under autocast: one stack dtype, split per source.
    g = torch.Generator().manual_seed(1)
    sources = [torch.randn(2, 3, 8, generator=g).to(dtype).requires_grad_()
               for dtype in (torch.float32, torch.bfloat16, torch.bfloat16)]
    query = torch.randn(8, generator=g).requires_grad_()
    compare(lambda q, *s: depth_softmax(q, list(s), eps), lambda q, *s: DepthSoftmax.apply(q, eps, *s),
            [query, *sources], False)


def test_the_fused_ops_compile_whole_through_their_fakes():
    """fullgraph=True raises on a graph break; the graph holds each op as one node, and equals eager."""
    from torch._dynamo.utils import counters

    def both(logits, query, a, b):
        mixed = fused_sinkhorn_knopp(logits, 5) @ a  # (..., 4, 4) @ (..., 4, 8)
        return depth_softmax(query, [mixed, b], 1e-6).square().sum()

    g = torch.Generator().manual_seed(2)
    inputs = [torch.randn(3, 4, 4, generator=g), torch.randn(8, generator=g), torch.randn(3, 4, 8, generator=g),
              torch.randn(3, 4, 8, generator=g)]
    eager_inputs = [x.clone().requires_grad_() for x in inputs]
    compiled_inputs = [x.clone().requires_grad_() for x in inputs]
    torch._dynamo.reset()
    counters.clear()
    graphs = []

    def backend(gm, example_inputs):  # aot_eager, keeping Dynamo's graph to look into
        from torch._dynamo.backends.registry import lookup_backend

        graphs.append(gm)
        return lookup_backend("aot_eager")(gm, example_inputs)

    compiled = torch.compile(both, backend=backend, fullgraph=True)
    compiled(*compiled_inputs).backward()
    both(*eager_inputs).backward()
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
    targets = [str(node.target) for node in graphs[0].graph.nodes if node.op == "call_function"]
    assert sum("sinkhorn_knopp" in t for t in targets) == 1 and sum("depth_softmax" in t for t in targets) == 1
    for got, expected in zip(compiled_inputs, eager_inputs, strict=True):
        torch.testing.assert_close(got.grad, expected.grad, rtol=1e-6, atol=1e-6)


def test_auto_picks_the_fused_ops_only_from_a_measurement():
    # None measured yet: auto is torch for both, everywhere.
    for op in (dispatch.SINKHORN_KNOPP, dispatch.DEPTH_SOFTMAX):
        assert not any(op in ops for ops in dispatch.measured.MEASURED_SPEEDUPS.values())
        assert not dispatch.use_triton("auto", op, torch.ones(2, 4, 4))
    table = {"NVIDIA H200": {dispatch.SINKHORN_KNOPP: 1.05, dispatch.DEPTH_SOFTMAX: 1.04}}
    assert dispatch.auto_picks_triton(dispatch.SINKHORN_KNOPP, "NVIDIA H200", table, 1.05)
    assert not dispatch.auto_picks_triton(dispatch.DEPTH_SOFTMAX, "NVIDIA H200", table, 1.05)  # below 1.05x
    assert not dispatch.auto_picks_triton(dispatch.SINKHORN_KNOPP, "NVIDIA H100 80GB HBM3", table, 1.05)


@pytest.mark.parametrize("residual", ["mhc", "attnres", "attnres_block"])
def test_the_kernel_option_of_the_residuals(residual):
    with pytest.raises(PluginError, match="kernel must be one of auto, triton, torch, got 'cuda'") as info:
        registry.create("residual", residual, {"kernel": "cuda"})
    assert "\n" not in str(info.value)
    assert registry.create("residual", residual, {"kernel": "torch"}).kernel == "torch"


def test_kernel_triton_on_cpu_is_one_clear_error_at_the_first_forward():
    pytest.importorskip("triton")
    from lit.models import GPT, TransformerConfig

    for residual, op in (("mhc", "sinkhorn_knopp"), ("attnres", "depth_softmax")):
        model = GPT(13, 7, TransformerConfig(d_model=8, n_layers=1, n_heads=2, residual=residual,
                                             residual_options={"kernel": "triton"}))
        with pytest.raises(PluginError, match=f"kernel: triton runs on CUDA tensors, but {op} got one on cpu; "
                                              f"use kernel: auto") as info:
            model(torch.zeros(1, 7, dtype=torch.long))
        assert "\n" not in str(info.value)
