"""Hyper-connections: n = 1 is exactly `add`, the reference's equations on hand-made tensors, the paper's init."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from arch_plugins import registry
from arch_plugins.interfaces import ResidualHistory, StackInfo
from arch_plugins.residuals.hyper_connections import HyperConnection
from arch_plugins.weight_decay import decays
from lit.models import TransformerConfig
from lit.models.transformer import TransformerStack
from tests.conftest import plain_and_twin

D, LAYERS, T = 16, 3, 8
INFO = StackInfo(D, LAYERS, 2, 4 * D, causal=True)


def stack(causal: bool = True, seed: int = 0, **kw) -> TransformerStack:
    torch.manual_seed(seed)
    cfg = TransformerConfig(**{"d_model": D, "n_layers": LAYERS, "n_heads": 2, **kw})
    return TransformerStack(cfg, causal=causal, max_len=T)


def reference_and(causal: bool, **kw) -> tuple[TransformerStack, TransformerStack]:
    """A plain-residual stack with non-trivial norm gains, and a hyper-connected one carrying the same weights."""
    return plain_and_twin(stack, causal, **kw)


@pytest.mark.parametrize("causal", [True, False], ids=["lm", "encoder"])
@pytest.mark.parametrize("name", ["hyperconn", "hyperconn_static"])
def test_four_streams_start_as_add_up_to_the_final_norm(name, causal):
    # At init the n streams stay copies of the plain residual stream (each sublayer reads one, writes all), and
    # their sum is n times it: the pre-norm's final RMSNorm removes the factor.
    ref, hyper = reference_and(causal, residual=name)
    x = torch.randn(3, T, D)
    torch.testing.assert_close(hyper(x), ref(x), rtol=0, atol=1e-5)
    with torch.no_grad():  # not vacuous: once the connections move, the output does
        for n, p in hyper.named_parameters():
            if "static_alpha" in n:
                p.add_(0.1 * torch.randn_like(p))
    assert not torch.allclose(hyper(x), ref(x), atol=1e-3)


def test_the_papers_init():
    residual = registry.create("residual", "hyperconn", {"streams": 4})
    for layer, sublayer, reads in [(0, "attn", 0), (0, "mlp", 1), (1, "attn", 2), (1, "mlp", 3), (2, "attn", 0)]:
        merge = residual.merge(sublayer, layer, INFO)
        expected = torch.zeros(4, 5)
        expected[reads, 0] = 1.0
        expected[:, 1:] = torch.eye(4)
        assert torch.equal(merge.static_alpha, expected), (layer, sublayer)
        assert torch.equal(merge.static_beta, torch.ones(4))
        assert not merge.dynamic_alpha.any() and not merge.dynamic_beta.any()
        assert merge.dynamic_alpha_scale.item() == merge.dynamic_beta_scale.item() == pytest.approx(0.01)
    static = registry.create("residual", "hyperconn_static").merge("attn", 0, INFO)
    assert {n for n, _ in static.named_parameters()} == {"static_alpha", "static_beta"}


def reference_equations(merge: HyperConnection, H: torch.Tensor, y: torch.Tensor):
    """lucidrains/hyper-connections' width and depth connections, written with einsum as there."""
    normed = F.normalize(H, dim=-1) * math.sqrt(H.shape[-1]) * merge.norm_gain
    alpha = merge.static_alpha + torch.tanh(normed @ merge.dynamic_alpha) * merge.dynamic_alpha_scale
    beta = merge.static_beta + torch.tanh(normed @ merge.dynamic_beta) * merge.dynamic_beta_scale
    mixed = torch.einsum("...st,...sd->...td", alpha, H)
    branch_input, residuals = mixed[..., 0, :], mixed[..., 1:, :]
    return branch_input, residuals + torch.einsum("...d,...s->...sd", y, beta)


def test_dynamic_connections_follow_the_reference_equations():
    torch.manual_seed(0)
    merge = registry.create("residual", "hyperconn", {"streams": 3}).merge("mlp", 1, INFO)
    with torch.no_grad():
        for p in merge.parameters():
            p.add_(0.3 * torch.randn_like(p))
    H, y = torch.randn(2, 5, 3, D), torch.randn(2, 5, D)
    history = ResidualHistory()
    expected_input, expected_out = reference_equations(merge, H, y)
    torch.testing.assert_close(merge.branch_input(H, history), expected_input, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(merge(H, y, history), expected_out, rtol=1e-5, atol=1e-5)


def test_static_connections_by_hand():
    # n = 2, d = 1: streams H = (1, 10); alpha_m = (0.5, 2); alpha_r = [[1, 3], [0, 1]]; beta = (2, -1); f = 7.
    merge = registry.create("residual", "hyperconn_static", {"streams": 2}).merge("attn", 0, INFO)
    with torch.no_grad():
        merge.static_alpha.copy_(torch.tensor([[0.5, 1.0, 3.0], [2.0, 0.0, 1.0]]))
        merge.static_beta.copy_(torch.tensor([2.0, -1.0]))
    H, y = torch.tensor([[1.0], [10.0]]), torch.tensor([7.0])
    assert merge.branch_input(H, ResidualHistory()).tolist() == [0.5 * 1 + 2 * 10]
    # stream 0: 1*1 + 0*10 + 2*7 = 15; stream 1: 3*1 + 1*10 - 7 = 6
    assert merge(H, y, ResidualHistory()).tolist() == [[15.0], [6.0]]


@pytest.mark.parametrize("name", ["hyperconn", "hyperconn_static"])
def test_gradients_reach_the_connections(name):
    model = stack(residual=name)
    model(torch.randn(2, T, D)).square().mean().backward()
    grads = {n: p.grad for n, p in model.named_parameters() if "merge" in n}
    assert grads and all(g is not None for g in grads.values())
    for n, g in grads.items():
        if n.endswith(("norm_gain", "_scale")):
            assert not g.any(), n  # tanh(H_bar W) = 0 while W = 0: they learn once W has moved
        else:
            assert g.abs().sum() > 0, n  # static alpha and beta, W_alpha, W_beta


def test_the_static_mixing_matrix_does_not_decay():
    model = stack(residual="hyperconn")
    decay = decays(model)
    named = dict(model.named_parameters())
    assert not decay[id(named["blocks.0.attn_merge.static_alpha"])]
    assert decay[id(named["blocks.0.attn_merge.dynamic_alpha"])]  # a projection, decayed like the others


def test_composes_with_pattention():
    """TokenFormer's projections inside, hyper-connections around: one stream is still exactly `add`."""
    tokens = {"tokens_qkv": 8, "tokens_out": 8, "tokens_ffn": 16}
    arch = {"norm": "layernorm_nonparam", "projection": "pattention", "projection_options": tokens}
    ref, hyper = reference_and(True, residual="hyperconn", residual_options={"streams": 1}, **arch)
    x = torch.randn(2, T, D)
    assert torch.equal(hyper(x), ref(x))
    four = stack(residual="hyperconn", **arch)
    four(x).square().mean().backward()
    assert all(p.grad is not None for n, p in four.named_parameters() if "key_param" in n or "static_alpha" in n)


def test_bad_streams_say_what_to_do():
    with pytest.raises(registry.PluginError, match="give an integer >= 1") as info:
        registry.create("residual", "hyperconn", {"streams": 0})
    assert "\n" not in str(info.value)
