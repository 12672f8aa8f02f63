"""Issue 43 item 2: Pattention's q|k|v key tokens in one GEMM with a segmented Θ, and Θ's factor in the scores'
dtype, compute what the three separate Pattentions and their ``cat`` computed.

``reference_theta`` and ``reference_forward`` below are the pre-rewrite versions, copied from commit 2fa5317 (the
repository just before the rewrite; ``arch_plugins/projections/pattention.py`` unchanged there since its last
commit). The fused module is compared with the ``Concat`` of its own parts run through the reference: output and
the gradients of the input and of every token, in fp32. One GEMM against the concatenated keys computes each score
as the separate GEMMs do, but the batched value GEMM may sum in another order: atol 1e-6, rtol 1e-5 (fp32 rounding
on values of order 0.1-1).

Issue 43 item 2, second round: Θ (``l2_norm_gelu``) as one autograd node (``L2NormGelu``: the eager chain's forward
op for op, a hand-written backward from z = A f, the factor and the norm, so the scores A are not kept) and the
fused value GEMM as ``torch.bmm`` rather than ``@``. ``current_theta`` is Θ at commit c7f3728, the repository just
before it (``reference_theta`` with the factor cast to the scores' dtype). The forward runs the same ops, so its
values are the same bit for bit, fp32 and bf16. The backward computes the same derivative in another order (the
norm's term from z rather than A): fp32 gradients to ATOL / RTOL; in bf16 both round at every op, and they agree to
2^-7 of the largest gradient (one bf16 rounding of the largest term, twice).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from arch_plugins import registry
from arch_plugins.interfaces import Concat, Role, StackInfo
from arch_plugins.projections.pattention import FusedPattentions, L2NormGelu, Pattention, theta

STACK = StackInfo(d_model=16, num_layers=4, num_heads=2, mlp_hidden=64, causal=True)
ATOL, RTOL = 1e-6, 1e-5  # fp32 rounding: the same products, summed in another order by the batched GEMM


def reference_theta(scores, activation, scale, eps):
    """pattention.theta at commit 2fa5317: the l2_norm_gelu factor multiplied in its own (fp32) dtype."""
    if activation == "l2_norm_gelu":
        factor = scale / (torch.linalg.vector_norm(scores, dim=-1, keepdim=True) + eps)
        return F.gelu(scores * factor)
    if activation == "gelu_l2_norm":
        g = F.gelu(scores)
        return g * (scale / (torch.linalg.vector_norm(g, dim=-1, keepdim=True) + eps))
    return torch.softmax(scores, dim=-1) * scale ** 2


def current_theta(scores, scale, eps):
    """pattention.theta's l2_norm_gelu at commit c7f3728: the eager chain, the factor cast to the scores' dtype."""
    factor = scale / (torch.linalg.vector_norm(scores, dim=-1, keepdim=True) + eps)
    return F.gelu(scores * factor.to(scores.dtype))


def reference_forward(p: Pattention, x: torch.Tensor) -> torch.Tensor:
    """Pattention.forward at commit 2fa5317 (torch path), one part of the old ``Concat``."""
    scores = x @ p.key_param_tokens.t()
    return reference_theta(scores, p.activation, p.scale_tokens.sqrt(), p.eps) @ p.value_param_tokens


def fused_qkv(activation: str, seed: int = 0) -> FusedPattentions:
    torch.manual_seed(seed)
    proj = registry.create("projection", "pattention", {"activation": activation, "kernel": "torch",
                                                        "value_std": 0.05})
    qkv = proj.fused(16, [16, 16, 16], [Role.Q, Role.K, Role.V], 0, STACK, bias=False, init_std=0.02)
    with torch.no_grad():  # keys of order 1, so that Θ's GeLU sees both signs and its curved part
        for p in qkv.parts:
            p.key_param_tokens.normal_(0.0, 0.5)
    return qkv


def run(module, x: torch.Tensor, forward) -> tuple[torch.Tensor, list[torch.Tensor]]:
    x = x.clone().requires_grad_(True)
    out = forward(module, x)
    (out * torch.linspace(-1.0, 1.0, out.numel()).view_as(out)).sum().backward()
    grads = [x.grad] + [p.grad.clone() for p in module.parameters()]
    module.zero_grad()
    return out, grads


def concat_reference(module: Concat, x: torch.Tensor) -> torch.Tensor:
    return torch.cat([reference_forward(p, x) for p in module.parts], dim=-1)


@pytest.mark.parametrize("activation", ["l2_norm_gelu", "gelu_l2_norm", "softmax"])
def test_fused_qkv_equals_three_pattentions_and_a_cat(activation):
    qkv = fused_qkv(activation)
    assert isinstance(qkv, FusedPattentions) and qkv.fusable
    x = torch.randn(2, 7, 16)
    out, grads = run(qkv, x, lambda m, t: m(t))
    ref_out, ref_grads = run(qkv, x, concat_reference)
    torch.testing.assert_close(out, ref_out, atol=ATOL, rtol=RTOL)
    for i, (g, ref) in enumerate(zip(grads, ref_grads, strict=True)):
        torch.testing.assert_close(g, ref, atol=ATOL, rtol=RTOL, msg=f"gradient {i} (0: input, then tokens)")


def test_each_segment_keeps_its_own_scale():
    """After a function-preserving growth a part's scale is sqrt(n_old), not sqrt(n): the segmented Θ reads each
    part's own. Different scales per part, so a Θ normalising whole rows or using one scale fails here."""
    qkv = fused_qkv("l2_norm_gelu", seed=1)
    with torch.no_grad():
        for p, n in zip(qkv.parts, (4.0, 9.0, 16.0), strict=True):
            p.scale_tokens.fill_(n)
    x = torch.randn(3, 16)
    torch.testing.assert_close(qkv(x), concat_reference(qkv, x), atol=ATOL, rtol=RTOL)


def test_one_token_without_batch_dims():
    qkv = fused_qkv("l2_norm_gelu", seed=2)
    x = torch.randn(16)
    torch.testing.assert_close(qkv(x), concat_reference(qkv, x), atol=ATOL, rtol=RTOL)


def test_the_state_dict_keeps_the_parts_names():
    """Checkpoints written before the fusion load: the tokens still live in the parts."""
    keys = set(fused_qkv("l2_norm_gelu").state_dict())
    assert keys == {f"parts.{i}.{name}" for i in range(3)
                    for name in ("key_param_tokens", "value_param_tokens", "scale_tokens")}


def test_theta_keeps_bf16_scores_in_bf16_and_equals_the_fp32_form_to_bf16_rounding(monkeypatch):
    """The factor in the scores' dtype: bf16 scores give bf16 weights. CUDA's autocast computes the norm in fp32
    (linalg_vector_norm is on its fp32 list; CPU's autocast leaves it bf16), so the old form promoted the product
    and the GeLU to fp32; the norm is made to answer in fp32 here as it does there. The TokenFormer reference
    normalises and applies GeLU in the model's dtype; from the same bf16 scores the values differ from the old fp32
    product and GeLU by bf16 rounding only: rtol 3 x 2^-8 (bf16's unit roundoff, once for the factor, the product
    and the GeLU) plus an atol for GeLU's near-zero outputs."""
    torch.manual_seed(3)
    scores = torch.randn(64, 48)
    scale = torch.tensor(48.0).sqrt()
    fp32 = theta(scores, "l2_norm_gelu", scale, 1e-5)
    torch.testing.assert_close(fp32, reference_theta(scores, "l2_norm_gelu", scale, 1e-5), atol=0, rtol=0)
    # TokenFormer's reference formula (its nonlinear_normalization, without eps) in fp32
    tokenformer = F.gelu(scores / torch.norm(scores, p=2, dim=-1, keepdim=True) * math.sqrt(48))
    torch.testing.assert_close(fp32, tokenformer, atol=1e-6, rtol=1e-5)

    vector_norm = torch.linalg.vector_norm
    monkeypatch.setattr(torch.linalg, "vector_norm", lambda t, *a, **k: vector_norm(t.float(), *a, **k))
    half = theta(scores.bfloat16(), "l2_norm_gelu", scale, 1e-5)
    old = reference_theta(scores.bfloat16(), "l2_norm_gelu", scale, 1e-5)
    assert half.dtype == torch.bfloat16 and old.dtype == torch.float32
    torch.testing.assert_close(half.float(), old, atol=1e-3, rtol=3 * 2 ** -8)


def fp32_norm(monkeypatch):
    """linalg.vector_norm answering in fp32, as CUDA's autocast has it (CPU's leaves bf16 inputs bf16)."""
    vector_norm = torch.linalg.vector_norm
    monkeypatch.setattr(torch.linalg, "vector_norm", lambda t, *a, **k: vector_norm(t.float(), *a, **k))


def theta_and_grad(fn, scores: torch.Tensor, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scores = scores.clone().requires_grad_(True)
    out = fn(scores)
    out.backward(grad)
    return out, scores.grad


# A scalar tensor scale (Pattention), a number, and one scale per segment (FusedPattentions, after a growth).
SCALES = {"tensor": torch.tensor(48.0).sqrt(), "number": 5.0, "segments": torch.tensor([[4.0], [9.0], [48.0]]).sqrt()}


@pytest.mark.parametrize("scale", SCALES.values(), ids=SCALES.keys())
def test_theta_node_equals_the_eager_chain_in_fp32(scale):
    """Forward bit for bit, the scores' gradient to fp32 rounding; a zero row (the norm's 0 / 0, eps keeps the
    factor finite) and rows large enough for GeLU's curved part on both sides."""
    torch.manual_seed(4)
    scores = torch.randn(5, 7, 3, 48) * 3
    scores[1, 2] = 0.0
    grad = torch.randn(5, 7, 3, 48)
    out, g = theta_and_grad(lambda a: theta(a, "l2_norm_gelu", scale, 1e-5), scores, grad)
    ref_out, ref_g = theta_and_grad(lambda a: current_theta(a, scale, 1e-5), scores, grad)
    torch.testing.assert_close(out, ref_out, atol=0, rtol=0)
    torch.testing.assert_close(g, ref_g, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(g[1, 2], ref_g[1, 2], atol=0, rtol=0)  # f dz alone, the norm's term 0


@pytest.mark.parametrize("norm_dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("scale", SCALES.values(), ids=SCALES.keys())
def test_theta_node_equals_the_eager_chain_in_bf16(scale, norm_dtype, monkeypatch):
    """bf16 scores, the norm in bf16 (CPU autocast) or fp32 (CUDA's): the same bf16 values forward, bit for bit;
    gradients in bf16 to 2^-7 of the largest (the two round at each op, in another order)."""
    if norm_dtype == "fp32":
        fp32_norm(monkeypatch)
    torch.manual_seed(5)
    scores = (torch.randn(64, 3, 48) * 2).bfloat16()
    grad = torch.randn(64, 3, 48).bfloat16()
    out, g = theta_and_grad(lambda a: theta(a, "l2_norm_gelu", scale, 1e-5), scores, grad)
    ref_out, ref_g = theta_and_grad(lambda a: current_theta(a, scale, 1e-5), scores, grad)
    assert out.dtype == g.dtype == torch.bfloat16
    torch.testing.assert_close(out, ref_out, atol=0, rtol=0)
    torch.testing.assert_close(g.float(), ref_g.float(), atol=2 ** -7 * ref_g.float().abs().max().item(), rtol=0)


@pytest.mark.parametrize("fused", [True, False], ids=["qkv", "one"])
def test_modules_under_bf16_autocast_equal_the_eager_chain(fused):
    """FusedPattentions (through bmm) and a single Pattention in a CPU bf16 autocast step, against the same modules
    run through c7f3728's math (``current_theta``, matmul): the output bit for bit; gradients of the input and the
    fp32 tokens to 2^-7 of the largest of each."""
    if fused:
        module = fused_qkv("l2_norm_gelu", seed=6)

        def before(m, x):
            first = m.parts[0]
            keys = torch.cat([p.key_param_tokens for p in m.parts])
            scores = (x @ keys.t()).unflatten(-1, (len(m.parts), first.num_tokens))
            scale = torch.stack([p.scale_tokens for p in m.parts]).sqrt().unsqueeze(-1)
            weights = current_theta(scores, scale, first.eps)
            values = torch.stack([p.value_param_tokens for p in m.parts])
            out = weights.reshape(-1, *weights.shape[-2:]).transpose(0, 1) @ values
            return out.transpose(0, 1).reshape(*x.shape[:-1], -1)
    else:
        torch.manual_seed(6)
        module = Pattention(16, 16, 64, kernel="torch", key_std=0.5, value_std=0.05)

        def before(m, x):
            return current_theta(x @ m.key_param_tokens.t(), m.scale_tokens.sqrt(), m.eps) @ m.value_param_tokens

    x = torch.randn(2, 9, 16)
    with torch.autocast("cpu", torch.bfloat16):
        out, grads = run(module, x, lambda m, t: m(t))
        ref_out, ref_grads = run(module, x, before)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, ref_out, atol=0, rtol=0)
    for i, (g, ref) in enumerate(zip(grads, ref_grads, strict=True)):
        torch.testing.assert_close(g, ref, atol=2 ** -7 * ref.abs().max().item(), rtol=0, msg=f"gradient {i}")


def test_theta_keeps_one_full_size_tensor_for_backward():
    """What the node keeps, through save_for_backward (so saved_tensors_hooks and the cost audit see it): z at the
    scores' size, and per-row values; the eager chain kept the scores and z."""
    scores = torch.randn(4, 3, 32, requires_grad=True)
    scale = torch.tensor([[2.0], [3.0], [4.0]])

    def saved_by(fn) -> dict[int, tuple[int, ...]]:
        """Each storage kept, once (the scores saved twice are one storage), with a shape it was saved as."""
        kept = {}
        with torch.autograd.graph.saved_tensors_hooks(
                lambda t: kept.setdefault(t.untyped_storage().data_ptr(), tuple(t.shape)) and t, lambda t: t):
            fn(scores, scale, 1e-5)
        return kept

    full = tuple(scores.shape)
    node = list(saved_by(lambda *a: theta(a[0], "l2_norm_gelu", *a[1:])).values())
    assert node.count(full) == 1 and all(s == full or s[-1] == 1 for s in node), node
    assert list(saved_by(current_theta).values()).count(full) == 2


def test_theta_node_compiles_as_one_graph():
    """torch.compile traces the autograd.Function, forward and backward, with no graph break."""
    torch._dynamo.reset()
    scale = torch.tensor([[2.0], [3.0], [4.0]])
    compiled = torch.compile(lambda a: theta(a, "l2_norm_gelu", scale, 1e-5), backend="aot_eager", fullgraph=True)
    scores = torch.randn(5, 3, 32)
    grad = torch.randn(5, 3, 32)
    out, g = theta_and_grad(compiled, scores, grad)
    ref_out, ref_g = theta_and_grad(lambda a: theta(a, "l2_norm_gelu", scale, 1e-5), scores, grad)
    torch.testing.assert_close(out, ref_out, atol=0, rtol=0)
    torch.testing.assert_close(g, ref_g, atol=ATOL, rtol=RTOL)


def test_theta_refuses_a_scale_that_wants_a_gradient():
    with pytest.raises(ValueError, match="no gradient"):
        theta(torch.randn(2, 4), "l2_norm_gelu", torch.tensor(2.0, requires_grad=True), 1e-5)
    assert L2NormGelu.apply(torch.randn(2, 4), 2.0, 1e-5).shape == (2, 4)
