"""Norm strategies from the literature: placement, per-layer behaviour, formulas, init identities, options."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from arch_plugins import catalogue, registry
from arch_plugins.interfaces import Site, StackInfo
from arch_plugins.norms.dyt import DynamicTanh, EmbeddingScale
from arch_plugins.norms.lns import ScaledNorm
from arch_plugins.norms.seednorm import SeeDNorm
from lit.models.transformer import TransformerConfig, TransformerStack

NAMES = ["postnorm", "perinorm", "mixnorm", "lns", "dyt", "seednorm"]
D, T = 32, 10
CAUSAL = pytest.mark.parametrize("causal", [True, False], ids=["lm", "encoder"])


def stack(causal: bool = True, n_layers: int = 3, seed: int = 0, **kw) -> TransformerStack:
    torch.manual_seed(seed)
    cfg = TransformerConfig(**{"d_model": D, "n_layers": n_layers, "n_heads": 4, **kw})
    return TransformerStack(cfg, causal=causal, max_len=T)


def perturb_gains(model: nn.Module) -> None:
    """Norm gains away from 1 (and biases from 0), so that equalities test the weights too."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.normal_(1.0, 0.2)


def copy_into(src: nn.Module, dst: nn.Module, rename=lambda key: key) -> list[str]:
    """Load src's weights into dst (keys mapped by ``rename``); every src weight must land. Returns dst's leftovers."""
    result = dst.load_state_dict({rename(k): v for k, v in src.state_dict().items()}, strict=False)
    assert not result.unexpected_keys, result.unexpected_keys
    return result.missing_keys


def run(model: TransformerStack, seed: int = 5) -> torch.Tensor:
    torch.manual_seed(seed)
    return model(torch.randn(2, T, D))


def test_every_strategy_is_registered():
    assert set(NAMES) <= set(registry.names("norm"))
    for name in NAMES:
        assert catalogue.summary(registry.spec("norm", name))


@pytest.mark.parametrize("name", ["postnorm", "perinorm", "mixnorm", "lns"])
def test_placements_build_on_layernorm_or_rmsnorm(name):
    for base, layer in (("rmsnorm", nn.RMSNorm), ("layernorm", nn.LayerNorm)):
        model = stack(norm=name, norm_options={"base": base, "eps": 1e-4})
        norms = [m for m in model.modules() if isinstance(m, (nn.RMSNorm, nn.LayerNorm))]
        assert norms and all(type(m) is layer and m.eps == 1e-4 for m in norms)
    with pytest.raises(registry.PluginError, match="base must be one of layernorm, rmsnorm"):
        registry.create("norm", name, {"base": "batchnorm"})


# --- post-norm and Peri-LN: where the norms sit ----------------------------------------------------

def test_postnorm_normalises_after_each_sum():
    model = stack(norm="postnorm", n_layers=2)
    perturb_gains(model)
    torch.manual_seed(5)
    x = torch.randn(2, T, D)
    h = x
    for b in model.blocks:
        assert isinstance(b.attn_in, nn.Identity) and isinstance(b.attn_after_add, nn.RMSNorm)
        h = b.attn_after_add(h + b.attn(h, model.rope))
        h = b.mlp_after_add(h + b.mlp(h))
    assert isinstance(model.final, nn.Identity)  # the last sum is already normalised
    assert torch.equal(model(x), h)
    assert isinstance(stack(norm="postnorm", norm_options={"final_norm": True}).final, nn.RMSNorm)


@pytest.mark.parametrize("embedding_norm", [True, False])
def test_perinorm_normalises_each_sublayers_input_and_output(embedding_norm):
    model = stack(norm="perinorm", norm_options={"embedding_norm": embedding_norm}, n_layers=2)
    perturb_gains(model)
    torch.manual_seed(5)
    x = torch.randn(2, T, D)
    h = model.embedding(x)
    assert isinstance(model.embedding, nn.RMSNorm if embedding_norm else nn.Identity)
    for b in model.blocks:
        assert isinstance(b.attn_after_add, nn.Identity) and isinstance(b.mlp_after_add, nn.Identity)
        h = h + b.attn_out(b.attn(b.attn_in(h), model.rope))
        h = h + b.mlp_out(b.mlp(b.mlp_in(h)))
    assert torch.equal(model(x), model.final(h))
    assert len({id(m) for m in model.modules() if isinstance(m, nn.RMSNorm)}) == 4 * 2 + 1 + embedding_norm


# --- Mix-LN -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("fraction,layers,post", [(0.25, 8, 2), (0.25, 12, 3), (0.25, 4, 1), (0.25, 3, 0),
                                                  (0.5, 6, 3), (0.29, 100, 29)])
def test_mixnorm_makes_the_first_floor_of_fraction_layers_post_norm(fraction, layers, post):
    strategy = registry.create("norm", "mixnorm", {"fraction": fraction})
    info = StackInfo(D, layers, 4, 64, causal=True)
    for layer in range(layers):
        is_post = layer < post
        assert (strategy.site(Site.ATTN_AFTER_ADD, D, layer, info) is not None) == is_post
        assert (strategy.site(Site.MLP_AFTER_ADD, D, layer, info) is not None) == is_post
        assert (strategy.site(Site.ATTN_IN, D, layer, info) is None) == is_post
    assert strategy.site(Site.FINAL, D, None, info) is not None


def test_mixnorm_refuses_a_fraction_outside_0_1():
    with pytest.raises(registry.PluginError, match=r"give a value in \[0, 1\]"):
        registry.create("norm", "mixnorm", {"fraction": 1.5})


# --- LayerNorm-Scaling -------------------------------------------------------------------------------

def lns_key(key: str) -> str:
    """rmsnorm's block norm weights sit one level deeper (inside ScaledNorm) in an lns stack."""
    return key.replace("_in.weight", "_in.norm.weight")


@CAUSAL
def test_lns_at_layer_0_is_prenorm(causal):
    ref = stack(causal, n_layers=1, norm="rmsnorm")
    perturb_gains(ref)
    lns = stack(causal, n_layers=1, seed=1, norm="lns")
    assert copy_into(ref, lns, lns_key) == []
    assert torch.equal(run(lns), run(ref))


def test_lns_scales_block_l_by_one_over_sqrt_l_plus_1():
    model = stack(norm="lns", n_layers=4)
    perturb_gains(model)
    x = torch.randn(2, T, D) * 3
    for layer, block in enumerate(model.blocks):
        for site in (block.attn_in, block.mlp_in):
            assert isinstance(site, ScaledNorm)
            expected = F.rms_norm(x, (D,), site.norm.weight, eps=1e-6) / math.sqrt(layer + 1)
            torch.testing.assert_close(site(x), expected, atol=1e-6, rtol=1e-6)
    assert type(model.final) is nn.RMSNorm  # final norm unscaled
    # Deeper layers differ from pre-norm: the test above is not vacuous.
    ref = stack(norm="rmsnorm", n_layers=4)
    copy_into(model, ref, lambda k: k.replace(".norm.weight", ".weight"))
    assert not torch.allclose(run(model), run(ref), atol=1e-3)


# --- DyT ---------------------------------------------------------------------------------------------

def test_dyt_formula():
    layer = DynamicTanh(4, alpha_init=0.7, bias=True)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([1.0, -2.0, 0.5, 3.0]))
        layer.bias.copy_(torch.tensor([0.0, 0.1, -0.2, 0.3]))
    x = torch.tensor([[0.0, 1.0, -2.0, 10.0]])
    expected = torch.tensor([[0.0, -2.0 * math.tanh(0.7) + 0.1, 0.5 * math.tanh(-1.4) - 0.2,
                              3.0 * math.tanh(7.0) + 0.3]])
    torch.testing.assert_close(layer(x), expected)
    assert layer.alpha.shape == (1,)  # one scalar per DyT layer


def test_dyt_defaults_follow_the_kind_of_stack():
    lm = stack(True, norm="dyt")
    assert [(b.attn_in.alpha.item(), b.mlp_in.alpha.item()) for b in lm.blocks] == [pytest.approx((1.0, 1.0))] * 3
    assert lm.final.alpha.item() == pytest.approx(1.0) and lm.final.bias is None
    assert isinstance(lm.embedding, EmbeddingScale) and lm.embedding.scale.item() == pytest.approx(math.sqrt(D))
    vit = stack(False, norm="dyt")
    alphas = [m.alpha.item() for m in vit.modules() if isinstance(m, DynamicTanh)]
    assert alphas == [0.5] * 7 and vit.final.bias is not None and isinstance(vit.embedding, nn.Identity)
    custom = stack(True, norm="dyt", norm_options={"alpha_attn": 1.5, "alpha_final": 0.1, "bias": True,
                                                   "embedding_scale": False})
    assert custom.blocks[0].attn_in.alpha.item() == 1.5 and custom.blocks[0].mlp_in.alpha.item() == pytest.approx(1.0)
    assert custom.final.alpha.item() == pytest.approx(0.1) and custom.final.bias is not None
    assert isinstance(custom.embedding, nn.Identity)


@pytest.mark.parametrize(("d_model", "expected"), [
    (128, (1.0, 1.0, 1.0)), (1024, (1.0, 1.0, 1.0)), (1536, (1.0, 0.5, 0.5)), (2048, (1.0, 0.5, 0.5)),
    (4096, (0.8, 0.2, 0.2)), (8192, (0.2, 0.05, 0.05))])
def test_dyt_lm_alpha_follows_the_papers_width_rule(d_model, expected):
    """DyT paper Table 11: alpha0 (attention / other) 1.0/1.0 at width 1024, 1.0/0.5 at 2048, 0.8/0.2 at 4096,
    0.2/0.05 at 8192; width, not depth, sets it. The 7B values (0.8 / 0.2 / 0.2) at d=128 fail this."""
    strategy = registry.create("norm", "dyt")
    info = StackInfo(d_model=d_model, num_layers=4, num_heads=4, mlp_hidden=4 * d_model, causal=True)
    got = tuple(strategy.site(s, d_model, layer, info).alpha.item()
                for s, layer in ((Site.ATTN_IN, 0), (Site.MLP_IN, 0), (Site.FINAL, None)))
    assert got == pytest.approx(expected)
    encoder = StackInfo(d_model=d_model, num_layers=4, num_heads=4, mlp_hidden=4 * d_model, causal=False)
    assert strategy.site(Site.MLP_IN, d_model, 0, encoder).alpha.item() == 0.5  # encoders keep 0.5 at any width
    override = registry.create("norm", "dyt", {"alpha_mlp": 0.3})
    assert override.site(Site.MLP_IN, d_model, 0, info).alpha.item() == pytest.approx(0.3)


def test_dyt_refuses_a_nonpositive_alpha():
    with pytest.raises(registry.PluginError, match="must be a positive number"):
        registry.create("norm", "dyt", {"alpha_mlp": 0.0})


# --- SeeDNorm ----------------------------------------------------------------------------------------

def test_seednorm_formula_multi_head():
    layer = SeeDNorm(4, heads=2, eps=1e-6, mean_dot=True)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([1.0, 2.0, 0.5, 1.0]))
        layer.alpha.copy_(torch.tensor([0.5, -1.0, 2.0, 1.0]))
        layer.beta.copy_(torch.tensor([1.0, 0.5, -0.3, 0.2]))
    x = torch.tensor([[1.0, -2.0, 3.0, 0.5]])
    rms = math.sqrt((1 + 4 + 9 + 0.25) / 4 + 1e-6)
    g1 = math.tanh((1.0 * 1.0 + -2.0 * 0.5) / 2)  # head 1: channels 0-1; mean_dot divides by the head width
    g2 = math.tanh((3.0 * -0.3 + 0.5 * 0.2) / 2)
    scale = [g1 * 0.5 + 1.0, g1 * -1.0 + 2.0, g2 * 2.0 + 0.5, g2 * 1.0 + 1.0]
    expected = torch.tensor([[s * v / rms for s, v in zip(scale, x[0].tolist(), strict=True)]])
    torch.testing.assert_close(layer(x), expected)


def test_seednorm_defaults_follow_the_kind_of_stack():
    lm, vit = stack(True, norm="seednorm"), stack(False, norm="seednorm")
    assert lm.blocks[0].attn_in.heads == 1 and lm.blocks[0].attn_in.dot_scale == 1.0
    assert vit.blocks[0].attn_in.heads == 16 and vit.blocks[0].attn_in.dot_scale == 1 / (D // 16)
    chosen = stack(False, norm="seednorm", norm_options={"heads": 4, "mean_dot": False})
    assert chosen.final.heads == 4 and chosen.final.dot_scale == 1.0


def test_seednorm_alpha_learns_once_beta_has():
    # At init tanh(x . beta) = 0 cuts alpha's gradient; beta's is nonzero (alpha = 1), so one step frees alpha.
    layer = SeeDNorm(8)
    x = torch.randn(5, 8)
    (layer(x) * torch.randn(5, 8)).sum().backward()
    assert not layer.alpha.grad.any() and layer.beta.grad.abs().sum() > 0
    with torch.no_grad():
        layer.beta.sub_(0.1 * layer.beta.grad)
    layer.zero_grad()
    (layer(x) * torch.randn(5, 8)).sum().backward()
    assert layer.alpha.grad.abs().sum() > 0


def test_seednorm_heads_must_divide_the_width():
    with pytest.raises(registry.PluginError, match="set norm_options.heads to a divisor of 32"):
        stack(norm="seednorm", norm_options={"heads": 5})
    with pytest.raises(registry.PluginError, match="heads must be a positive divisor"):
        registry.create("norm", "seednorm", {"heads": 0})
