"""nGPT: the hypersphere norm strategy and the ngpt residual against the spec's formulas and nGPT-pytorch."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from arch_plugins import registry
from arch_plugins.constraints import renormalize_, unit_norm_parameters
from arch_plugins.interfaces import ResidualHistory, Role, Site, StackInfo
from arch_plugins.norms.hypersphere import HypersphereStrategy, L2Normalize
from arch_plugins.residuals.ngpt import NGPTResidual
from benchmarks.ngpt_pytorch_peer import import_ngpt_pytorch
from lit.models import GPT, TransformerConfig, TransformerStack
from lit.models.rope import RotaryEmbedding

STACK = StackInfo(d_model=32, num_layers=2, num_heads=4, mlp_hidden=48, causal=True)


def ngpt(**kw) -> TransformerConfig:
    return TransformerConfig(**{"d_model": 32, "n_layers": 2, "n_heads": 4, "norm": "hypersphere",
                                "residual": "ngpt", **kw})


def randomize_scales_(model: torch.nn.Module, generator: torch.Generator) -> None:
    """Move every learned scale off its initial value (positive), so no term hides behind a 1."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("stored"):
                p.mul_(0.5 + torch.rand(p.shape, generator=generator))


def unit(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True)


# --- each site against the spec ---------------------------------------------------------------------

def test_effective_initial_values_follow_the_scale_trick():
    norm, d = HypersphereStrategy(), STACK.d_model
    qk = norm.qk(0, STACK)
    hidden = norm.site(Site.MLP_HIDDEN, 96, 0, STACK)
    logits = norm.site(Site.LOGITS, 50, None, STACK)
    alpha = NGPTResidual().merge("attn", 0, STACK).alpha
    # stored = scale, effective = init (times sqrt(d) on the MLP hidden), as NVIDIA's reference.
    torch.testing.assert_close(qk.s_qk.stored, torch.full((d,), d ** -0.5))
    torch.testing.assert_close(qk.s_qk(), torch.ones(d))
    torch.testing.assert_close(hidden.scale.stored, torch.ones(96))
    torch.testing.assert_close(hidden.scale(), torch.full((96,), math.sqrt(d)))
    torch.testing.assert_close(logits.scale.stored, torch.full((50,), d ** -0.5))
    torch.testing.assert_close(logits.scale(), torch.ones(50))
    torch.testing.assert_close(alpha.stored, torch.full((d,), d ** -0.5))
    torch.testing.assert_close(alpha(), torch.full((d,), 0.05))


def test_qk_site_gives_the_logits_of_normalized_q_and_k_scaled_per_head():
    g = torch.Generator().manual_seed(0)
    qk = HypersphereStrategy(s_qk_init=2.0, s_qk_scale=0.5).qk(0, STACK)
    randomize_scales_(qk, g)
    q, k = torch.randn(2, 4, 5, 8, generator=g), torch.randn(2, 4, 5, 8, generator=g)
    s = (qk.s_qk.stored * (2.0 / 0.5)).view(4, 1, 8)  # one value per (head, channel)
    got_q, got_k = qk(q, k)
    # The spec scales both q and k by s_qk; the module folds s_qk^2 into q: the logits are what must agree.
    torch.testing.assert_close(got_q @ got_k.transpose(-1, -2), (s * unit(q)) @ (s * unit(k)).transpose(-1, -2))
    torch.testing.assert_close(got_k.norm(dim=-1), torch.ones(2, 4, 5))
    assert HypersphereStrategy().softmax_scale(0, STACK) == math.sqrt(8)


def test_mlp_hidden_and_logit_sites():
    g = torch.Generator().manual_seed(1)
    norm = HypersphereStrategy(s_uv_init=1.5, s_uv_scale=3.0, s_z_init=2.0, s_z_scale=0.25)
    hidden, logits = norm.site(Site.MLP_HIDDEN, 96, 0, STACK), norm.site(Site.LOGITS, 50, None, STACK)
    randomize_scales_(hidden, g)
    randomize_scales_(logits, g)
    x = torch.randn(3, 96, generator=g)
    torch.testing.assert_close(hidden(x), x * hidden.scale.stored * (1.5 / 3.0) * math.sqrt(32))
    z = torch.randn(3, 50, generator=g)
    torch.testing.assert_close(logits(z), z * logits.scale.stored * (2.0 / 0.25))


def test_stream_sites_normalize_and_norm_layers_are_absent():
    norm = HypersphereStrategy()
    for site in (Site.ATTN_OUT, Site.ATTN_AFTER_ADD, Site.MLP_OUT, Site.MLP_AFTER_ADD, Site.EMBEDDING):
        assert isinstance(norm.site(site, 32, 0, STACK), L2Normalize), site
    for site in (Site.ATTN_IN, Site.MLP_IN, Site.FINAL):
        assert norm.site(site, 32, 0, STACK) is None, site
    assert HypersphereStrategy(normalize_embedding=False).site(Site.EMBEDDING, 32, None, STACK) is None
    x = torch.randn(4, 32) * 7
    torch.testing.assert_close(L2Normalize()(x), unit(x))
    assert torch.equal(L2Normalize()(torch.zeros(2, 32)), torch.zeros(2, 32))  # no NaN on a zero vector


@pytest.mark.parametrize("absolute", [True, False])
def test_ngpt_residual_is_a_lerp_with_eigen_learning_rates(absolute):
    g = torch.Generator().manual_seed(2)
    merge = NGPTResidual(alpha_mlp_init=0.2, alpha_scale=0.1, absolute=absolute).merge("mlp", 0, STACK)
    with torch.no_grad():
        merge.alpha.stored.copy_(torch.randn(32, generator=g) * 0.1)  # some negative entries
    alpha = merge.alpha.stored * (0.2 / 0.1)
    alpha = alpha.abs() if absolute else alpha
    h, y = unit(torch.randn(2, 3, 32, generator=g)), unit(torch.randn(2, 3, 32, generator=g))
    torch.testing.assert_close(merge(h, y, ResidualHistory()), h + alpha * (y - h))


def test_every_weight_role_is_constrained_along_d_model():
    model = GPT(40, 8, ngpt(mlp="swiglu"))
    assert all(HypersphereStrategy().constrains(r) for r in (Role.Q, Role.K, Role.V, Role.ATTN_OUT, Role.MLP_IN,
                                                             Role.MLP_GATE, Role.MLP_OUT, Role.FFN,
                                                             Role.EMBEDDING, Role.HEAD))
    declared = {name: dim for name, _, dim in unit_norm_parameters(model)}
    block = "stack.blocks.1."
    assert declared == {"tok.weight": 1, "head.weight": 1,
                        **{f"stack.blocks.{i}.{n}": dim for i in range(2) for n, dim in
                           (("attn.qkv.weight", 1), ("attn.out.weight", 0), ("mlp.up.weight", 1),
                            ("mlp.down.weight", 0))}}
    renormalize_(model)
    w = dict(model.named_parameters())
    torch.testing.assert_close(w[block + "attn.out.weight"].norm(dim=0), torch.ones(32))  # columns: d_model rows
    torch.testing.assert_close(w[block + "mlp.up.weight"].norm(dim=1), torch.ones(w[block + "mlp.up.weight"].shape[0]))


def test_renormalization_of_low_precision_weights_goes_through_fp32():
    from arch_plugins.constraints import declare_unit_norm

    layer = torch.nn.Linear(64, 8, bias=False).to(torch.bfloat16)
    with torch.no_grad():
        layer.weight.mul_(5)
    declare_unit_norm(layer, "weight", 0)
    assert renormalize_(layer) == 1 and layer.weight.dtype == torch.bfloat16
    torch.testing.assert_close(layer.weight.float().norm(dim=0), torch.ones(64), atol=1e-2, rtol=0)


@pytest.mark.parametrize("option", ["s_qk_scale=0", "s_z_scale=-1.0"])
def test_bad_scale_options_are_one_line_errors(option):
    key, value = option.split("=")
    with pytest.raises(registry.PluginError, match=f"{key} must be positive") as info:
        GPT(10, 8, ngpt(norm_options={key: float(value)}))
    assert "\n" not in str(info.value)
    with pytest.raises(registry.PluginError, match="alpha_scale must be positive"):
        GPT(10, 8, ngpt(residual_options={"alpha_scale": 0.0}))


def test_kernel_option_and_when_the_residual_fuses_the_stream_update():
    for options in ({"norm_options": {"kernel": "cuda"}}, {"residual_options": {"kernel": "fast"}}):
        with pytest.raises(registry.PluginError, match="kernel must be one of auto, triton, torch") as info:
            GPT(10, 8, ngpt(**options))
        assert "\n" not in str(info.value)
    fused = lambda cfg: [(b.attn_fused, b.mlp_fused) for b in TransformerStack(cfg, causal=True, max_len=8).blocks]
    # auto (the default) takes the block's tail (on the torch path until a GPU measurement says otherwise).
    assert fused(ngpt()) == [(True, True)] * 2
    assert fused(ngpt(residual_options={"kernel": "torch"})) == [(False, False)] * 2
    assert fused(ngpt(norm="rmsnorm")) == [(False, False)] * 2  # the sites are not the hypersphere's norms
    assert fused(ngpt(drop_path=0.1)) == [(True, True), (False, False)]  # stochastic depth sits in between


def test_fused_tail_on_its_torch_path_is_the_unfused_block_exactly():
    torch.manual_seed(7)
    unfused = GPT(40, 8, ngpt(residual_options={"kernel": "torch"}))
    fused = GPT(40, 8, ngpt())
    fused.load_state_dict(unfused.state_dict())
    idx = torch.randint(0, 40, (2, 8))
    assert torch.equal(fused(idx), unfused(idx))


# --- a whole block against the spec, written out by hand ----------------------------------------------

def spec_block(block, h: torch.Tensor, rope: RotaryEmbedding, causal: bool) -> torch.Tensor:
    """NVIDIA's reference nGPT block (NVIDIA/ngpt) with a correct RoPE, from the block's own weights."""
    B, T, d = h.shape
    H = block.attn.n_heads
    dk = d // H
    q, k, v = F.linear(h, block.attn.qkv.weight).split(d, dim=-1)
    q, k, v = (t.view(B, T, H, dk).transpose(1, 2) for t in (q, k, v))
    s_qk = block.attn.qk.s_qk().view(H, 1, dk)
    q, k = s_qk * unit(rope(q)), s_qk * unit(rope(k))
    att = (q @ k.transpose(-2, -1)) * math.sqrt(dk)
    if causal:
        att = att.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
    y = (att.softmax(-1) @ v).transpose(1, 2).reshape(B, T, d)
    h_a = unit(F.linear(y, block.attn.out.weight))
    h = unit(h + block.attn_merge.alpha().abs() * (h_a - h))
    uv = F.linear(h, block.mlp.up.weight) * block.mlp.hidden.scale()  # s_uv * sqrt(d) folded in
    u, nu = uv.chunk(2, dim=-1)
    h_m = unit(F.linear(u * F.silu(nu), block.mlp.down.weight))
    return unit(h + block.mlp_merge.alpha().abs() * (h_m - h))


@pytest.mark.parametrize("causal", [True, False])
def test_block_equals_the_spec_formulas(causal):
    g = torch.Generator().manual_seed(3)
    torch.manual_seed(3)
    stack = TransformerStack(ngpt(mlp_hidden=64, n_layers=1), causal=causal, max_len=12)
    renormalize_(stack)
    randomize_scales_(stack, g)
    h = unit(torch.randn(2, 12, 32, generator=g))
    with torch.no_grad():
        got = stack.blocks[0](h, ResidualHistory(states=[h]), stack.rope)
        expected = spec_block(stack.blocks[0], h, stack.rope, causal)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_non_causal_stack_sees_the_future_and_stays_on_the_sphere():
    torch.manual_seed(4)
    stack = TransformerStack(ngpt(), causal=False, max_len=10)
    renormalize_(stack)
    x = torch.randn(2, 10, 32) * 3  # e.g. patch embeddings: not unit norm, the embedding site normalizes
    changed = x.clone()
    changed[:, -1] += 1.0
    with torch.no_grad():
        out, out_changed = stack(x), stack(changed)
    torch.testing.assert_close(out.norm(dim=-1), torch.ones(2, 10))
    assert not torch.allclose(out[:, 0], out_changed[:, 0])  # position 0 attends to the last token


# --- nGPT-pytorch equality ------------------------------------------------------------------------

def interleaved_to_half(head_dim: int) -> torch.Tensor:
    """Our rotate-half RoPE pairs (i, i + d/2); rotary-embedding-torch pairs (2i, 2i + 1): a permutation."""
    return torch.cat([torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)])


@torch.no_grad()
def copy_from_ngpt_pytorch_(stack: TransformerStack, layers, dim: int, heads: int) -> None:
    """Load nGPT-pytorch's effective weights and scales (after its parametrization) into our stack.

    ``layers`` is ``nGPT.layers`` ([Residual(attn), Residual(ff)] per layer) or ``nTransformer.layers``
    ([attn, ff, alpha_attn, alpha_ff]).
    """
    dk = dim // heads
    perm = (torch.arange(heads)[:, None] * dk + interleaved_to_half(dk)[None]).flatten()
    for block, layer in zip(stack.blocks, layers, strict=True):
        if len(layer) == 2:
            attn, ff, alpha_attn, alpha_ff = layer[0].fn, layer[1].fn, layer[0].branch_scale, layer[1].branch_scale
        else:
            attn, ff, alpha_attn, alpha_ff = layer
        block.attn.qkv.weight.copy_(torch.cat([attn.to_q.weight[perm], attn.to_k.weight[perm], attn.to_v.weight]))
        # It scales q only, by a vector equal to our s_qk squared (ours: s_qk on q and k, as the paper).
        qk = block.attn.qk.s_qk
        qk.stored.copy_(attn.qk_scale()[perm].sqrt() / qk.multiplier)
        block.attn.out.weight.copy_(attn.to_out.weight)
        block.mlp.up.weight.copy_(torch.cat([ff.to_hidden.weight, ff.to_gate.weight]))
        # Its sqrt(d) multiplies the gate only (effective s_u, s_v * sqrt(d)); ours folds sqrt(d) into u|v.
        s = block.mlp.hidden.scale
        s.stored.copy_(torch.cat([ff.hidden_scale(), ff.gate_scale() * math.sqrt(dim)]) / s.multiplier)
        block.mlp.down.weight.copy_(ff.to_out.weight)
        for merge, alpha in ((block.attn_merge, alpha_attn), (block.mlp_merge, alpha_ff)):
            merge.alpha.stored.copy_(alpha() / merge.alpha.multiplier)


def test_gpt_equals_ngpt_pytorch():
    nGPT_pytorch = import_ngpt_pytorch()
    g = torch.Generator().manual_seed(5)
    torch.manual_seed(5)
    V, d, depth, heads, T = 37, 32, 2, 2, 16
    theirs = nGPT_pytorch.nGPT(num_tokens=V, dim=d, depth=depth, heads=heads, dim_head=d // heads,
                               attn_norm_qk=True, ff_expand_factor=6,  # int(32 * 6 * 2/3) = 128 = 4d hidden
                               add_value_residual=False, alpha_init=0.05, tied_embedding=False).eval()
    with torch.no_grad():  # move every scale off its init (positive: our alpha is |alpha|, s_qk a square root)
        for name, p in theirs.named_parameters():
            if name.endswith(".scale"):
                p.mul_(0.5 + torch.rand(p.shape, generator=g))
    ours = GPT(V, T, ngpt(d_model=d, n_layers=depth, n_heads=heads, mlp="swiglu", mlp_hidden=4 * d)).eval()
    with torch.no_grad():
        ours.tok.weight.copy_(theirs.token_embed.weight)
        ours.head.weight.copy_(theirs.to_logits.weight)
        ours.logits.scale.stored.copy_(theirs.logit_scale() / ours.logits.scale.multiplier)
    copy_from_ngpt_pytorch_(ours.stack, theirs.layers, d, heads)
    idx = torch.randint(0, V, (3, T), generator=g)
    with torch.no_grad():
        expected, got = theirs(idx), ours(idx)
    assert expected.std() > 0.05  # not a trivial constant
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_non_causal_stack_equals_ngpt_pytorch_ntransformer():
    nGPT_pytorch = import_ngpt_pytorch()
    g = torch.Generator().manual_seed(6)
    torch.manual_seed(6)
    d, depth, heads, T = 32, 2, 2, 12
    theirs = nGPT_pytorch.nTransformer(dim=d, depth=depth, heads=heads, dim_head=d // heads, causal=False,
                                       rotary_embed=True, ff_expand_factor=6, alpha_init=0.05).eval()
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            if name.endswith(".scale"):
                p.mul_(0.5 + torch.rand(p.shape, generator=g))
    ours = TransformerStack(ngpt(d_model=d, n_layers=depth, n_heads=heads, mlp_hidden=4 * d), causal=False,
                            max_len=T).eval()
    copy_from_ngpt_pytorch_(ours, theirs.layers, d, heads)
    x = torch.randn(2, T, d, generator=g)
    with torch.no_grad():
        expected, got = theirs(x, norm_input=True), ours(x)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
