"""The Triton kernels in Triton's CPU interpreter: tiny, odd-sized, non-contiguous inputs, and the plugins' wiring.

Not collected by the default run (the name does not start with ``test_``): TRITON_INTERPRET must be set before
triton is first imported (its own library functions are built for one mode at import), and in the test session
something (lightning) has imported it long before. tests/test_kernels.py runs this file in a fresh process
with TRITON_INTERPRET=1. By hand:

    TRITON_INTERPRET=1 python -m pytest tests/kernels_interpreted.py -q
"""

from __future__ import annotations

import pytest
import torch

from arch_plugins.kernels import dispatch
from arch_plugins.norms.hypersphere import l2_normalize
from arch_plugins.projections.pattention import theta
from tests.kernel_checks import (
    check_depth_softmax,
    check_ngpt_stream_update,
    check_pattention_theta,
    check_qk_normalize,
    check_row_l2_normalize,
    check_sinkhorn_knopp,
    compare,
    eager_stream_update,
    fused_op_samples,
)

if not dispatch.interpreting():
    pytest.skip("runs with TRITON_INTERPRET=1 in a fresh process (tests/test_kernels.py starts it)",
                allow_module_level=True)
pytest.importorskip("triton")

LOW = [torch.float32, torch.bfloat16]


# --- each op against its eager path ------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", LOW)
def test_row_l2_normalize(dtype):
    check_row_l2_normalize((3, 5, 17), dtype)


def test_row_l2_normalize_clamps_like_the_eager_path():
    from arch_plugins.kernels.row_l2_normalize import row_l2_normalize

    # A zero row, a row below eps (the clamp is active: no projection term in the gradient), a normal row.
    x = torch.stack([torch.zeros(9), torch.full((9,), 1e-4), torch.linspace(-1, 2, 9)]).requires_grad_()
    compare(lambda x: row_l2_normalize(x, 1e-3), lambda x: l2_normalize(x, 1e-3), [x], False)


@pytest.mark.parametrize("dtype", LOW)
def test_qk_normalize(dtype):
    check_qk_normalize(2, 3, 5, 7, dtype)  # an odd head_dim; B*H programs, each a (batch, head)


def test_qk_normalize_loops_over_time_tiles():
    check_qk_normalize(1, 2, 67, 64, torch.float32)  # 64 time steps per tile: two tiles, the second partial


@pytest.mark.parametrize("stream_dtype, branch_dtype", [(torch.float32, torch.float32),
                                                        (torch.float32, torch.bfloat16),  # bf16 autocast
                                                        (torch.bfloat16, torch.bfloat16)])
def test_ngpt_stream_update(stream_dtype, branch_dtype):
    check_ngpt_stream_update((3, 5, 17), stream_dtype, branch_dtype)


def test_ngpt_stream_update_without_a_branch_gradient_over_many_tiles():
    # 4 programs loop over 25 tiles of 4 rows each (the partial sums of d alpha).
    check_ngpt_stream_update((10, 10, 33), torch.float32, torch.float32, branch_grad=False)


def test_ngpt_stream_update_in_bf16_is_at_least_as_accurate_as_eager():
    """fp32 statistics: against a float64 truth, the kernel's bf16 result is no worse than the eager path's."""
    from arch_plugins.kernels.ngpt_stream_update import ngpt_stream_update

    g = torch.Generator().manual_seed(3)
    h, b = l2_normalize(torch.randn(4, 33, generator=g)), torch.randn(4, 33, generator=g)
    alpha = torch.rand(33, generator=g)
    truth = eager_stream_update(h.double(), b.double(), alpha.double(), 1e-12, 1e-12)[0]
    h16, b16 = h.bfloat16(), b.bfloat16()
    err_kernel = (ngpt_stream_update(h16, b16, alpha, 1e-12, 1e-12)[0].double() - truth).abs().max()
    err_eager = (eager_stream_update(h16, b16, alpha, 1e-12, 1e-12)[0].double() - truth).abs().max()
    assert err_kernel <= err_eager


@pytest.mark.parametrize("dtype", LOW)
def test_pattention_theta(dtype):
    check_pattention_theta((3, 5, 19), dtype)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on the NaN row, in the interpreter
def test_pattention_theta_on_a_zero_row_and_eps_zero():
    from arch_plugins.kernels.pattention_theta import pattention_theta

    scores = torch.stack([torch.zeros(6), torch.linspace(-2, 1, 6)]).requires_grad_()
    compare(lambda a: pattention_theta(a, 2.0, 1e-5), lambda a: theta(a, "l2_norm_gelu", 2.0, 1e-5), [scores], False)
    # eps = 0 is the reference GPU code: a zero row is NaN in both.
    assert torch.isnan(pattention_theta(torch.zeros(1, 4), 2.0, 0.0)).all()


# The fused Sinkhorn's backward reruns the forward up to each step (iters^2 / 2 steps), which the interpreter runs
# op by op: a few iterations here exercise every path; the CUDA tests run the paper's 20.
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on the padding's exp(-inf - -inf), masked out
@pytest.mark.parametrize("n, iters", [(4, 3),
                                      (3, 8)])  # n = 3 pads each matrix to 4 x 4; 8 iterations would overflow a
def test_sinkhorn_knopp(n, iters):                # padded row's gradient (1/eps each) if the kernel let it grow
    check_sinkhorn_knopp((2, 3), n, iters=iters)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_sinkhorn_knopp_floors_sums_like_the_torch_path():
    """Logits 60 apart underflow exp to 0 in float32: a column of zeros sums below eps and is floored, where the
    clamp's gradient is cut (the torch path's [sum >= eps] mask)."""
    from arch_plugins.kernels.sinkhorn_knopp import sinkhorn_knopp as fused
    from arch_plugins.residuals.manifold_hyper_connections import sinkhorn_knopp

    logits = torch.zeros(2, 3, 3)
    logits[:, :, 0] = 60.0  # every row's maximum in column 0: columns 1 and 2 are exp(-60) ~ 1e-26
    logits[1, 2, 2] = 30.0
    compare(lambda x: fused(x, 2), lambda x: sinkhorn_knopp(x, 2), [logits.requires_grad_()], False)


@pytest.mark.parametrize("dtypes, eps", [([torch.float32] * 3, 1e-6),
                                         ([torch.float32] * 4, None),  # key_norm: none
                                         ([torch.float32, torch.bfloat16, torch.bfloat16], 1e-6)])  # autocast
def test_depth_softmax(dtypes, eps):
    check_depth_softmax((3, 5, 17), dtypes, eps)


def test_depth_softmax_loops_over_many_tiles():
    # 23 rows of 4 per tile over 4 persistent programs: the query's gradient summed per program, then by torch.
    check_depth_softmax((23, 4, 33), [torch.float32] * 2, 1e-6)


# --- through the plugins: kernel: triton against kernel: torch, whole models -------------------------------

def counting(monkeypatch, module_name: str, function: str) -> list[int]:
    """Count the calls of a kernel op (the plugins import it when they use it, so the patch is seen)."""
    import importlib

    module = importlib.import_module(module_name)
    calls, original = [], getattr(module, function)

    def wrapper(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, function, wrapper)
    return calls


def grads_of(model: torch.nn.Module, idx: torch.Tensor):
    import torch.nn.functional as F

    logits = model(idx)
    F.cross_entropy(logits[:, :-1].flatten(0, 1), idx[:, 1:].flatten()).backward()
    return logits, {n: p.grad for n, p in model.named_parameters()}


def equal_models(arch_for_kernel, seed: int):
    from lit.models import GPT, TransformerConfig

    torch.manual_seed(seed)
    reference = GPT(13, 7, TransformerConfig(**arch_for_kernel("torch")))
    fused = GPT(13, 7, TransformerConfig(**arch_for_kernel("triton")))
    fused.load_state_dict(reference.state_dict())
    return reference, fused


def test_ngpt_model_with_kernels_equals_torch(monkeypatch):
    from arch_plugins.constraints import renormalize_
    from arch_plugins.interfaces import ResidualHistory

    calls = {op: counting(monkeypatch, f"arch_plugins.kernels.{op}", op)
             for op in ("row_l2_normalize", "qk_normalize", "ngpt_stream_update")}
    # d 20 with 4 heads: head_dim 5 (odd); positions none: q and k reach the kernel as permuted views.
    arch = lambda kernel: dict(d_model=20, n_layers=2, n_heads=4, norm="hypersphere", residual="ngpt",
                               positions="none", norm_options={"kernel": kernel},
                               residual_options={"kernel": kernel})
    reference, fused = equal_models(arch, seed=0)
    renormalize_(reference)
    fused.load_state_dict(reference.state_dict())
    assert all(b.attn_fused and b.mlp_fused for b in fused.stack.blocks)
    assert not any(b.attn_fused or b.mlp_fused for b in reference.stack.blocks)  # kernel: torch: the plain block
    idx = torch.randint(0, 13, (2, 7), generator=torch.Generator().manual_seed(0))
    (ref_logits, ref_grads), (got_logits, got_grads) = grads_of(reference, idx), grads_of(fused, idx)
    torch.testing.assert_close(got_logits, ref_logits, rtol=1e-5, atol=1e-5)
    for name, grad in ref_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-5, atol=1e-5, msg=name)
    # The embedding site, q/k per block, two stream updates per block (the fused tail).
    assert (len(calls["row_l2_normalize"]), len(calls["qk_normalize"]), len(calls["ngpt_stream_update"])) == (1, 2, 4)
    # The fused tail fills the history as the unfused block does (the diagnostics read the branches).
    h = l2_normalize(torch.randn(2, 7, 20))
    histories = [ResidualHistory(states=[h]), ResidualHistory(states=[h])]
    with torch.no_grad():
        for model, history in zip((reference, fused), histories, strict=True):
            model.stack.blocks[0](h, history, None)
    for ref, got in zip(histories[0].branches + histories[0].states, histories[1].branches + histories[1].states,
                        strict=True):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_tokenformer_model_with_kernels_equals_torch(monkeypatch):
    calls = counting(monkeypatch, "arch_plugins.kernels.pattention_theta", "pattention_theta")
    arch = lambda kernel: dict(d_model=12, n_layers=1, n_heads=2, norm="layernorm_nonparam", projection="pattention",
                               projection_options={"tokens_qkv": 9, "tokens_out": 11, "tokens_ffn": 30,
                                                   "kernel": kernel})
    reference, fused = equal_models(arch, seed=1)
    idx = torch.randint(0, 13, (2, 7), generator=torch.Generator().manual_seed(1))
    (ref_logits, ref_grads), (got_logits, got_grads) = grads_of(reference, idx), grads_of(fused, idx)
    torch.testing.assert_close(got_logits, ref_logits, rtol=1e-5, atol=1e-5)
    for name, grad in ref_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-5, atol=1e-5, msg=name)
    assert len(calls) == 5  # q, k, v, out, FFN


@pytest.mark.parametrize("residual, op", [("mhc", "sinkhorn_knopp"), ("attnres", "depth_softmax"),
                                          ("attnres_block", "depth_softmax")])
def test_residual_models_with_fused_ops_equal_torch(monkeypatch, residual, op):
    calls = counting(monkeypatch, f"arch_plugins.kernels.{op}", op)
    # mHC with 2 Sinkhorn iterations (the interpreter's cost grows with their square) and gates far from 0, so
    # that H_res depends on the tokens.
    options = {"sinkhorn_iters": 2, "gating_init": 0.5} if residual == "mhc" else {}
    arch = lambda kernel: dict(d_model=12, n_layers=2, n_heads=2, residual=residual,
                               residual_options={**options, "kernel": kernel})
    reference, fused = equal_models(arch, seed=2)
    idx = torch.randint(0, 13, (2, 7), generator=torch.Generator().manual_seed(2))
    (ref_logits, ref_grads), (got_logits, got_grads) = grads_of(reference, idx), grads_of(fused, idx)
    torch.testing.assert_close(got_logits, ref_logits, rtol=1e-5, atol=1e-5)
    for name, grad in ref_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-5, atol=1e-5, msg=name)
    # mHC: one Sinkhorn per sublayer; AttnRes: one depth softmax per sublayer after the first, and the output's.
    assert len(calls) == {"mhc": 4, "attnres": 4, "attnres_block": 4}[residual]


def test_auto_stays_on_torch_off_cuda_even_in_the_interpreter(monkeypatch):
    from lit.models import GPT, TransformerConfig

    calls = [counting(monkeypatch, f"arch_plugins.kernels.{op}", op) for op in dispatch.OPS]
    # Even a table that names every op for "cpu" does not make auto run Triton on CPU tensors.
    monkeypatch.setattr(dispatch.measured, "MEASURED_SPEEDUPS", {"cpu": dict.fromkeys(dispatch.OPS, 9.0)})
    for arch in (dict(norm="hypersphere", residual="ngpt"), dict(projection="pattention"), dict(residual="mhc"),
                 dict(residual="attnres")):
        model = GPT(13, 7, TransformerConfig(d_model=8, n_layers=1, n_heads=2, **arch))
        model(torch.zeros(1, 7, dtype=torch.long)).sum().backward()
    assert not any(calls)


# --- torch.compile: the custom ops keep the graph whole -----------------------------------------------------

def op_samples():
    """One call per op at tiny, non-contiguous shapes: (op, args) for torch.library.opcheck."""
    from arch_plugins.kernels import ngpt_stream_update, pattention_theta, qk_normalize, row_l2_normalize
    from tests.kernel_checks import strided

    g = torch.Generator().manual_seed(5)
    qkv = torch.randn(2, 5, 3, 3, 7, generator=g)
    q, k, _ = qkv.permute(2, 0, 3, 1, 4)
    h = l2_normalize(torch.randn(3, 5, 17, generator=g))
    return [
        (row_l2_normalize._forward_op, (strided((3, 5, 17), torch.float32).requires_grad_(), 1e-12)),
        (qk_normalize._forward_op, (q.requires_grad_(), k.requires_grad_(),
                                    (torch.rand(3, 7, generator=g) + 0.5).requires_grad_(), 1e-12)),
        (ngpt_stream_update._forward_op, (h.requires_grad_(), strided((3, 5, 17), torch.float32).requires_grad_(),
                                          torch.rand(17, generator=g).requires_grad_(), 1e-12, 1e-12)),
        (pattention_theta._forward_op, (strided((3, 5, 19), torch.float32).requires_grad_(),
                                        torch.tensor(3.0), 1e-5)),
        *fused_op_samples(),
    ]


@pytest.mark.parametrize("index", range(len(dispatch.OPS)), ids=list(dispatch.OPS))
def test_each_op_passes_torch_library_opcheck(index):
    """Schema, fake (shapes, dtypes, strides against the real op), autograd registration, AOT dispatch."""
    op, args = op_samples()[index]
    torch.library.opcheck(op, args)


@pytest.mark.parametrize("arch", ["ngpt", "tokenformer"])
def test_models_with_kernels_compile_as_one_graph_and_equal_eager(arch):
    """kernel: triton under torch.compile(fullgraph=True): no graph break (fullgraph raises on one), one graph,
    and the same logits and gradients as the same model run eagerly with the kernels."""
    from torch._dynamo.utils import counters

    from lit.models import GPT, TransformerConfig

    options = (dict(norm="hypersphere", residual="ngpt", positions="none", norm_options={"kernel": "triton"},
                    residual_options={"kernel": "triton"}) if arch == "ngpt" else
               dict(norm="layernorm_nonparam", projection="pattention", positions="none",
                    projection_options={"tokens_qkv": 9, "tokens_out": 11, "tokens_ffn": 30, "kernel": "triton"}))
    torch.manual_seed(0)
    eager = GPT(13, 7, TransformerConfig(d_model=20, n_layers=2, n_heads=4, **options))
    compiled = GPT(13, 7, TransformerConfig(d_model=20, n_layers=2, n_heads=4, **options))
    compiled.load_state_dict(eager.state_dict())
    idx = torch.randint(0, 13, (2, 7), generator=torch.Generator().manual_seed(0))
    torch._dynamo.reset()
    counters.clear()
    (ref_logits, ref_grads) = grads_of(eager, idx)
    got_logits, _ = grads_of(torch.compile(compiled, backend="aot_eager", fullgraph=True), idx)
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"], dict(counters["graph_break"])
    torch.testing.assert_close(got_logits, ref_logits, rtol=1e-6, atol=1e-6)
    for name, param in compiled.named_parameters():
        torch.testing.assert_close(param.grad, ref_grads[name], rtol=1e-6, atol=1e-6, msg=name)
