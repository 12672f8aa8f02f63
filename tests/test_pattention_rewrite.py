"""Issue 43 item 2: Pattention's q|k|v key tokens in one GEMM with a segmented Θ, and Θ's factor in the scores'
dtype, compute what the three separate Pattentions and their ``cat`` computed.

``reference_theta`` and ``reference_forward`` below are the pre-rewrite versions, copied from commit 2fa5317 (the
repository just before the rewrite; ``arch_plugins/projections/pattention.py`` unchanged there since its last
commit). The fused module is compared with the ``Concat`` of its own parts run through the reference: output and
the gradients of the input and of every token, in fp32. One GEMM against the concatenated keys computes each score
as the separate GEMMs do, but the batched value GEMM may sum in another order: atol 1e-6, rtol 1e-5 (fp32 rounding
on values of order 0.1-1).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from arch_plugins import registry
from arch_plugins.interfaces import Concat, Role, StackInfo
from arch_plugins.projections.pattention import FusedPattentions, Pattention, theta

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
