"""mHC: doubly stochastic mixing, the composite gain across depth, equality with Megatron-LM's implementation of the
paper, agreement with DeepSeek-V4's production Sinkhorn, the init (plain residual when the gates are 0)."""

from __future__ import annotations

import functools
import math

import pytest
import torch
import torch.nn.functional as F

from arch_plugins import registry
from arch_plugins.diagnostics import declared_diagnostics
from arch_plugins.interfaces import ResidualHistory, StackInfo
from arch_plugins.residuals.manifold_hyper_connections import ManifoldConstrainedConnection, sinkhorn_knopp
from lit.models import GPT, TransformerConfig
from lit.models.transformer import TransformerStack
from lit.models.vit import ViT
from tests.conftest import plain_and_twin

D, LAYERS, T = 16, 3, 8
INFO = StackInfo(D, LAYERS, 2, 4 * D, causal=True)


def stack(causal: bool = True, seed: int = 0, **kw) -> TransformerStack:
    torch.manual_seed(seed)
    cfg = TransformerConfig(**{"d_model": D, "n_layers": LAYERS, "n_heads": 2, **kw})
    return TransformerStack(cfg, causal=causal, max_len=T)


@functools.cache
def mhc(streams: int = 4):
    return registry.create("residual", "mhc", {"streams": streams})


def shaken(streams: int = 4, scale: float = 0.5, seed: int = 0) -> ManifoldConstrainedConnection:
    """A merge far from its init: gates of ``scale`` (50 times the init), random static biases, so every map is
    input-dependent and uneven."""
    torch.manual_seed(seed)
    merge = mhc(streams).merge("attn", 0, INFO)
    with torch.no_grad():
        for gate in (merge.alpha_pre, merge.alpha_post, merge.alpha_res):
            gate.fill_(scale)
        merge.bias.normal_(0.0, scale)
    return merge


def test_sinkhorn_projects_onto_the_doubly_stochastic_matrices():
    torch.manual_seed(0)
    m = sinkhorn_knopp(torch.randn(256, 4, 4), iters=20)
    assert (m >= 0).all()
    torch.testing.assert_close(m.sum(-2), torch.ones(256, 4), rtol=0, atol=1e-6)  # columns: the last step
    torch.testing.assert_close(m.sum(-1), torch.ones(256, 4), rtol=0, atol=1e-3)  # rows: converged within 20 steps
    # 20 iterations are the paper's trade-off: wider logits converge slower (its gain of up to ~1.6), more steps close
    # the gap.
    wide = 3.0 * torch.randn(256, 4, 4)
    assert (sinkhorn_knopp(wide, 20).sum(-1) - 1).abs().max() > 1e-2
    torch.testing.assert_close(sinkhorn_knopp(wide, 2000).sum(-1), torch.ones(256, 4), rtol=0, atol=1e-4)
    # Zero logits (the static part at init) give exactly the uniform average.
    torch.testing.assert_close(sinkhorn_knopp(torch.zeros(4, 4), 20), torch.full((4, 4), 0.25), rtol=0, atol=0)


def test_every_merge_mixes_with_a_doubly_stochastic_matrix_and_bounded_pre_post():
    merge = shaken()
    h = 3.0 * torch.randn(2, 5, 4, D)
    pre, post, res = merge.coefficients(h)
    assert pre.shape == post.shape == (2, 5, 4) and res.shape == (2, 5, 4, 4)
    assert ((pre > 0) & (pre < 1)).all() and ((post > 0) & (post < 2)).all()
    assert (res >= 0).all()
    torch.testing.assert_close(res.sum(-1), torch.ones(2, 5, 4), rtol=0, atol=1e-4)
    torch.testing.assert_close(res.sum(-2), torch.ones(2, 5, 4), rtol=0, atol=1e-4)
    assert res.std() > 0.05  # not vacuous: the mixing is far from uniform and differs per token


def _gain(product: torch.Tensor) -> torch.Tensor:
    """The paper's Amax gain magnitude of a composite map: the larger of its max absolute row and column sums."""
    a = product.abs()
    return torch.maximum(a.sum(-1).amax(-1), a.sum(-2).amax(-1)).max()


@pytest.mark.parametrize("depth", [1, 8, 64])
def test_the_composite_residual_map_keeps_the_streams_scale_at_any_depth(depth):
    # Through the residual path alone (branches off) the streams are mixed by H_res layer after layer: the product
    # of doubly stochastic matrices is doubly stochastic, so its gain stays 1 and the streams' norm never grows.
    h = 3.0 * torch.randn(2, 5, 4, D)
    product = torch.eye(4).expand(2, 5, 4, 4)
    norm0 = h.norm(dim=(-2, -1))
    for layer in range(depth):
        res = shaken(seed=layer).coefficients(h)[2]
        product, h = res @ product, res @ h
    assert _gain(product) <= 1 + 1e-3
    assert (h.norm(dim=(-2, -1)) <= norm0 * (1 + 1e-3)).all()


def test_unconstrained_mixing_would_blow_up_the_gain():
    # The same random maps without the projection (a row softmax only, as one Sinkhorn half-step) drift away from
    # gain 1 with depth: what the constraint prevents, and a check that the test above can fail.
    torch.manual_seed(0)
    product = torch.eye(4)
    for _ in range(64):
        product = torch.softmax(2.0 * torch.randn(4, 4), dim=-1) @ product
    assert _gain(product) > 1.5


@pytest.mark.parametrize("depth", [2, 8, 32])
def test_at_init_the_stream_grows_with_depth_as_the_plain_residual_does(depth):
    x = torch.randn(2, T, D)
    last: dict[str, torch.Tensor] = {}
    for residual in ("add", "mhc"):
        model = stack(residual=residual, n_layers=depth)
        model.blocks[-1].register_forward_hook(lambda _m, _a, out, key=residual: last.__setitem__(key, out))
        with torch.no_grad():
            model(x)
    scales = {key: out.pow(2).mean().sqrt().item() for key, out in last.items()}  # mHC: every stream, averaged
    assert scales["mhc"] == pytest.approx(scales["add"], rel=0.05)


# --- Megatron-LM's HyperConnectionModule (NVIDIA/Megatron-LM@d98e8a64ddf3, megatron/core/transformer/
# hyper_connection.py), ported line by line in its [s, b, n*C] layout -------------------------------------------


def megatron_mappings(merge: ManifoldConstrainedConnection, x: torch.Tensor, iters: int = 20):
    n = merge.streams
    nC = x.shape[-1]
    r = x.norm(dim=-1, keepdim=True) / math.sqrt(nC)  # _projection_and_get_norm, lines 224-226
    r = 1.0 / (r + 1e-6)
    proj = x @ merge.phi.t()  # mapping_proj, bias=False (lines 182-184)
    alpha_ = torch.cat([merge.alpha_pre.expand(n), merge.alpha_post.expand(n), merge.alpha_res.expand(n * n)])
    h = r * proj * alpha_ + merge.bias  # _compute_h, lines 244-253
    h_pre = h[..., :n].sigmoid()
    h_post = h[..., n:2 * n].sigmoid() * 2
    logits = h[..., 2 * n:].view(*x.shape[:-1], n, n)
    M = torch.exp(logits - logits.max(dim=-1, keepdim=True).values)  # SinkhornKnopp.forward, line 108
    for _ in range(iters):  # _sinkhorn_normalize, lines 81-85
        M = M / M.sum(dim=-1, keepdim=True).clamp(min=1e-6)
        M = M / M.sum(dim=-2, keepdim=True).clamp(min=1e-6)
    return h_pre, h_post, M


def megatron_layer(merge, x_flat, f):
    """aggregate (line 391), f, then apply_h_res (line 416: H_res @ residual) + _apply_h_post (line 317)."""
    n = merge.streams
    h_pre, h_post, h_res = megatron_mappings(merge, x_flat)
    streams = x_flat.view(*x_flat.shape[:-1], n, -1)
    aggregated = (streams * h_pre.unsqueeze(-1)).sum(dim=-2)
    out = f(aggregated)
    mixed = h_res @ streams
    return aggregated, (h_post.unsqueeze(-1) * out.unsqueeze(-2) + mixed)


def test_equals_megatrons_implementation_of_the_paper():
    merge = shaken(streams=3, scale=0.7)
    h = torch.randn(4, 6, 3, D)  # (s, b, n, C)
    f = torch.nn.Linear(D, D)
    expected_input, expected_out = megatron_layer(merge, h.flatten(-2), f)
    got_input = merge.branch_input(h, ResidualHistory())
    torch.testing.assert_close(got_input, expected_input, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(merge(h, f(got_input), ResidualHistory()), expected_out, rtol=1e-5, atol=1e-5)


def deepseek_v4_comb(comb_logits: torch.Tensor, iters: int = 20, eps: float = 1e-6) -> torch.Tensor:
    """DeepSeek-V4's production Sinkhorn (huggingface/transformers@0197608, models/deepseek_v4/
    modeling_deepseek_v4.py, DeepseekV4HyperConnection.forward): a row softmax + eps, columns, then iters - 1 rounds;
    the decoder layer applies it transposed (comb^T @ streams), so the paper's H_res is comb^T."""
    comb = torch.softmax(comb_logits, dim=-1) + eps
    comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    return comb


def test_agrees_with_deepseek_v4s_production_sinkhorn():
    # Different step order and epsilons, the same doubly stochastic limit: within 1e-3 after the paper's 20
    # iterations, within 1e-5 once both have converged.
    torch.manual_seed(0)
    logits = torch.randn(32, 4, 4)
    for iters, atol in ((20, 1e-3), (200, 1e-5)):
        theirs = deepseek_v4_comb(logits.transpose(-1, -2), iters).transpose(-1, -2)
        torch.testing.assert_close(sinkhorn_knopp(logits, iters), theirs, rtol=0, atol=atol)


def test_the_papers_init():
    merge = registry.create("residual", "mhc").merge("mlp", 2, INFO)
    assert merge.streams == 4 and merge.sinkhorn_iters == 20
    assert merge.phi.shape == (4 * 4 + 2 * 4, 4 * D)
    bound = math.sqrt(6 / (4 * D + 24))  # Xavier-uniform, as Megatron-LM's _init_weights (line 203)
    assert merge.phi.abs().max() <= bound and merge.phi.abs().max() > 0.9 * bound
    assert merge.alpha_pre.item() == merge.alpha_post.item() == merge.alpha_res.item() == pytest.approx(0.01)
    assert not merge.bias.any()


@pytest.mark.parametrize("causal", [True, False], ids=["lm", "encoder"])
def test_with_the_gates_at_zero_it_is_the_plain_residual(causal):
    # H_pre = 1/2, H_post = 1, H_res = J/4: the streams stay copies of the plain stream, each sublayer reads twice it
    # (its pre-norm removes the factor) and adds its output once; the mean after the last block is the plain stream.
    ref, mhc = plain_and_twin(stack, causal, residual="mhc", residual_options={"gating_init": 0.0})
    x = torch.randn(3, T, D)
    torch.testing.assert_close(mhc(x), ref(x), rtol=0, atol=1e-5)
    with torch.no_grad():  # not vacuous: once the static maps move, the output does
        for n, p in mhc.named_parameters():
            if n.endswith("merge.bias"):
                p.normal_(0.0, 1.0)
    assert not torch.allclose(mhc(x), ref(x), atol=1e-3)


def backprop_gpt_and_vit() -> tuple:
    """A 2-layer GPT and a 2-layer ViT with mHC, one backward each (the conformance kit checks that gradients
    exist; here every mixing parameter must actually receive one at init)."""
    torch.manual_seed(0)
    gpt = GPT(vocab_size=11, block_size=T, arch=TransformerConfig(d_model=D, n_layers=2, n_heads=2, residual="mhc"))
    idx = torch.randint(0, 11, (2, T))
    F.cross_entropy(gpt(idx).flatten(0, 1), idx.flatten()).backward()
    vit = ViT(num_classes=3, image_size=8, patch_size=4, in_chans=1,
              arch=TransformerConfig(d_model=D, n_layers=2, n_heads=2, mlp="gelu", positions="none", residual="mhc"))
    vit(torch.randn(2, 1, 8, 8)).sum().backward()
    return gpt, vit


def test_gpt_and_vit_train_with_mhc():
    # alpha_res is left out of the non-zero check: at init its gradient is rounding noise. The last merge's streams
    # are averaged, so each of its H_res's columns gets one gradient and a column sums to 1 whatever the logits:
    # exactly zero. The first merge's streams are copies, so its gradient only meets the last row step's residual.
    # (tests/test_hyper_connections_rewrite.py checks alpha_res's gradient away from init.)
    for model in backprop_gpt_and_vit():
        grads = {n: p.grad for n, p in model.named_parameters() if "merge" in n}
        assert grads and all(g is not None for g in grads.values())
        silent = [n for n, g in grads.items() if not n.endswith("alpha_res") and not g.abs().sum() > 0]
        assert not silent, silent


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm", "3pt"])
def test_composes_with_norms(norm):
    options = {"horn": False, "phases": 2} if norm == "3pt" else {}  # d = 16: two phases of four pairs
    model = stack(False, residual="mhc", norm=norm, norm_options=options)
    out = model(torch.randn(2, T, D))
    out.square().mean().backward()
    assert torch.isfinite(out).all() and all(p.grad is not None for p in model.parameters())


def test_declares_its_gates_for_the_diagnostics():
    names = {name for name, _, _ in declared_diagnostics(stack(residual="mhc"))}
    expected = {"blocks.0.attn_merge.alpha_res", "blocks.2.mlp_merge.alpha_pre", "blocks.1.attn_merge.res_diagonal"}
    assert expected <= names
    merge = registry.create("residual", "mhc").merge("attn", 0, INFO)
    # The static self-weight at init: uniform mixing, 1/4.
    declared = {name: fn for name, _, fn in declared_diagnostics(merge)}
    assert declared["res_diagonal"](merge).item() == pytest.approx(0.25)


@pytest.mark.parametrize("options, message", [({"sinkhorn_iters": 0}, "give an integer >= 1"),
                                              ({"streams": 0}, "give an integer >= 1")])
def test_bad_options_say_what_to_do(options, message):
    with pytest.raises(registry.PluginError, match=message) as info:
        registry.create("residual", "mhc", options)
    assert "\n" not in str(info.value)
