"""Pattention against its formula, its options, inits and token counts; layernorm_nonparam."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from arch_plugins import registry
from arch_plugins.constraints import renormalize_, unit_norm_parameters
from arch_plugins.interfaces import Role, Site, StackInfo
from arch_plugins.kernels import dispatch
from arch_plugins.projections.pattention import Pattention
from arch_plugins.registry import PluginError
from lit.models.transformer import TransformerConfig, TransformerStack

STACK = StackInfo(d_model=8, num_layers=4, num_heads=2, mlp_hidden=32, causal=True)


def test_pattention_equals_its_formula_on_a_hand_made_case():
    p = Pattention(2, 3, n=2, eps=0.0)
    with torch.no_grad():
        p.key_param_tokens.copy_(torch.tensor([[1.0, 0.0], [0.0, 2.0]]))
        p.value_param_tokens.copy_(torch.tensor([[1.0, 2.0, 3.0], [-1.0, 0.0, 1.0]]))
    x = torch.tensor([[3.0, 1.0]])
    # scores = x K^T = [3, 2]; ||.|| = sqrt(13); Θ = GeLU(scores / sqrt(13) * sqrt(2)).
    gelu = lambda v: 0.5 * v * (1 + math.erf(v / math.sqrt(2)))
    s1, s2 = gelu(3 / math.sqrt(13) * math.sqrt(2)), gelu(2 / math.sqrt(13) * math.sqrt(2))
    expected = torch.tensor([[s1 - s2, 2 * s1, 3 * s1 + s2]])
    torch.testing.assert_close(p(x), expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("activation", ["l2_norm_gelu", "gelu_l2_norm", "softmax"])
def test_every_activation_matches_the_reference_definition(activation):
    torch.manual_seed(0)
    p = Pattention(6, 5, n=7, activation=activation, eps=0.0)
    x = torch.randn(2, 3, 6)
    a = x @ p.key_param_tokens.t()
    n = 7
    if activation == "l2_norm_gelu":
        s = F.gelu(a / a.norm(dim=-1, keepdim=True) * math.sqrt(n))
    elif activation == "gelu_l2_norm":
        g = F.gelu(a)
        s = g / g.norm(dim=-1, keepdim=True) * math.sqrt(n)
    else:
        s = torch.exp(a) / torch.exp(a).sum(-1, keepdim=True) * n
    torch.testing.assert_close(p(x), s @ p.value_param_tokens, rtol=1e-5, atol=1e-6)


def test_epsilon_keeps_a_zero_input_finite():
    p = Pattention(4, 4, n=3)
    assert torch.isfinite(p(torch.zeros(1, 4))).all()
    assert torch.isnan(Pattention(4, 4, n=3, eps=0.0)(torch.zeros(1, 4))).any()  # the reference GPU code's NaN


def test_projection_type_builds_tokenformer_by_default():
    proj = registry.create("projection", "pattention", {})
    q = proj.linear(8, 8, Role.Q, 0, STACK, bias=False, init_std=0.02)
    out = proj.linear(8, 8, Role.ATTN_OUT, 0, STACK, bias=False, init_std=0.02)
    ffn = proj.ffn(0, STACK, bias=False, init_std=0.02)
    assert (q.num_tokens, out.num_tokens, ffn.num_tokens) == (8, 8, 32)  # n_qkv = n_o = d, n_ffn = 4d
    torch.manual_seed(0)
    big = proj.ffn(0, StackInfo(256, 12, 4, 1024, True), bias=False, init_std=0.02)
    assert big.key_param_tokens.std().item() == pytest.approx(0.02, rel=0.02)
    assert big.value_param_tokens.std().item() == pytest.approx(2 / 12 / math.sqrt(256), rel=0.02)  # wang init


def test_token_counts_and_activation_are_options():
    proj = registry.create("projection", "pattention",
                           {"tokens_qkv": 5, "tokens_out": 6, "tokens_ffn": 7, "activation": "softmax"})
    assert proj.linear(8, 8, Role.V, 0, STACK, bias=False, init_std=0.02).num_tokens == 5
    assert proj.linear(8, 8, Role.ATTN_OUT, 0, STACK, bias=False, init_std=0.02).num_tokens == 6
    assert proj.ffn(0, STACK, bias=False, init_std=0.02).activation == "softmax"


def test_bad_options_are_one_clear_error():
    with pytest.raises(registry.PluginError, match="activation"):
        registry.create("projection", "pattention", {"activation": "relu"})
    proj = registry.create("projection", "pattention", {})
    with pytest.raises(PluginError, match="arch.bias=false"):
        proj.linear(8, 8, Role.Q, 0, STACK, bias=True, init_std=0.02)
    with pytest.raises(registry.PluginError, match="kernel must be one of auto, triton, torch"):
        registry.create("projection", "pattention", {"kernel": "cuda"})
    if dispatch.triton_import_error() is None:
        with pytest.raises(registry.PluginError, match="Θ kernel for activation l2_norm_gelu only"):
            registry.create("projection", "pattention", {"kernel": "triton", "activation": "softmax"})
    assert Pattention(4, 4, n=3, kernel="torch").kernel == "torch" and Pattention(4, 4, n=3).kernel == "auto"


def test_tokenformer_stack_has_no_dense_weights_and_tokenformer_norms():
    cfg = TransformerConfig(d_model=16, n_layers=2, n_heads=2, norm="layernorm_nonparam", projection="pattention")
    stack = TransformerStack(cfg, causal=True, max_len=8)
    params = dict(stack.named_parameters())
    assert all(name.endswith("param_tokens") or name.startswith("final.") for name in params), list(params)
    assert {n for n in params if n.startswith("final.")} == {"final.weight", "final.bias"}
    block = stack.blocks[0]
    assert isinstance(block.mlp, Pattention) and block.mlp.num_tokens == 64
    assert len(block.attn.qkv.parts) == 3  # separate q, k, v Pattentions, as the reference
    assert block.attn_in.weight is None and block.mlp_in.bias is None
    # 16 d^2 per layer: 4 * 2 d^2 (q, k, v, o) + 8 d^2 (ffn with 4d tokens).
    assert sum(p.numel() for n, p in params.items() if n.startswith("blocks.")) == 2 * 16 * 16 ** 2
    y = stack(torch.randn(2, 8, 16))
    assert y.shape == (2, 8, 16) and torch.isfinite(y).all()


def test_layernorm_nonparam_sites():
    norm = registry.create("norm", "layernorm_nonparam", {})
    assert not norm.site(Site.ATTN_IN, 8, 0, STACK).elementwise_affine
    assert norm.site(Site.FINAL, 8, None, STACK).elementwise_affine
    assert norm.site(Site.ATTN_OUT, 8, 0, STACK) is None


def test_pattention_can_carry_unit_norm_constraints():
    p = Pattention(8, 6, n=5)
    p.constrain_unit_norm("in")
    assert {name: dim for name, _, dim in unit_norm_parameters(p)} == {"key_param_tokens": 1, "value_param_tokens": 1}
    renormalize_(p)
    torch.testing.assert_close(p.key_param_tokens.norm(dim=1), torch.ones(5))
    torch.testing.assert_close(p.value_param_tokens.norm(dim=1), torch.ones(5))
