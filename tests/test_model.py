"""The transformer stack: correct RoPE and attention, every plugin hook called, reference equality."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from arch_plugins import registry
from arch_plugins.constraints import renormalize_, unit_norm_parameters
from arch_plugins.interfaces import NormStrategy, ProjectionType, ResidualMerge, ResidualType, Role, Site
from lit.models import GPT, TransformerConfig
from lit.models.rope import RotaryEmbedding


def tiny(**kw) -> TransformerConfig:
    return TransformerConfig(**{"d_model": 32, "n_layers": 2, "n_heads": 4, **kw})


@pytest.fixture
def plugin():
    """Register in-process plugins for one test."""
    added = []

    def add(kind, name, cls):
        registry.register(kind, name, cls)
        added.append((kind, name))

    yield add
    for kind, name in added:
        registry.unregister(kind, name)


# --- RoPE -----------------------------------------------------------------------------------------

def test_rope_is_a_rotation_with_relative_positions():
    torch.manual_seed(0)
    rope = RotaryEmbedding(16, max_len=64)
    q, k = torch.randn(1, 1, 64, 16), torch.randn(1, 1, 64, 16)
    same_q, same_k = q[:, :, :1].expand_as(q), k[:, :, :1].expand_as(k)
    rq, rk = rope(same_q), rope(same_k)
    torch.testing.assert_close(rq.norm(dim=-1), same_q.norm(dim=-1))  # norms are kept
    scores = (rq @ rk.transpose(-1, -2))[0, 0]  # q_m . k_n for identical vectors at every position
    for offset in (0, 3, -5):  # depends only on m - n
        diag = torch.diagonal(scores, offset)
        torch.testing.assert_close(diag, diag[:1].expand_as(diag), atol=1e-4, rtol=1e-4)
    assert torch.equal(rope(q)[:, :, 0], q[:, :, 0])  # position 0 is not rotated


def test_rope_matches_the_complex_formula():
    torch.manual_seed(0)
    d, T, base = 8, 10, 10000.0
    x = torch.randn(1, 2, T, d, dtype=torch.float64)
    freqs = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    z = torch.complex(x[..., : d // 2], x[..., d // 2:]) * torch.polar(
        torch.ones(T, d // 2, dtype=torch.float64), torch.outer(torch.arange(T, dtype=torch.float64), freqs))
    expected = torch.cat([z.real, z.imag], dim=-1)
    torch.testing.assert_close(RotaryEmbedding(d, T, base)(x.float()).double(), expected, atol=1e-5, rtol=1e-5)


def full_rope_as_before(x: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """The RoPE of every head dim, computed exactly as lit/models/rope.py did before rope_pct existed."""
    d, T = x.shape[-1], x.shape[-2]
    inv_freq = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    cos, sin = angles.cos().float().to(x.dtype), angles.sin().float().to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def test_rope_pct_one_is_the_full_rope_exactly():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 12, 16)
    assert torch.equal(RotaryEmbedding(16, 12, pct=1.0)(x), full_rope_as_before(x))
    assert torch.equal(RotaryEmbedding(16, 12)(x), full_rope_as_before(x))
    default, explicit = GPT(50, 16, tiny()), GPT(50, 16, tiny(rope_pct=1.0))
    explicit.load_state_dict(default.state_dict())
    idx = torch.randint(0, 50, (2, 16))
    assert torch.equal(default(idx), explicit(idx))


def test_rope_pct_rotates_only_the_leading_dims_of_each_head():
    """GPT-NeoX / TokenFormer rotary_pct 0.25 with head_dim 16: dims 0..3 are a RoPE of dimension 4 (pairs (0, 2)
    and (1, 3), frequencies 1 and base^(-1/2)); dims 4..15 pass through."""
    torch.manual_seed(0)
    T, base = 6, 10000.0
    x = torch.randn(1, 2, T, 16, dtype=torch.float64)
    out = RotaryEmbedding(16, T, base, pct=0.25)(x.float()).double()
    expected = x.clone()
    for t in range(T):
        for i, freq in ((0, 1.0), (1, base ** -0.5)):  # pair (i, i + 2)
            c, s = math.cos(t * freq), math.sin(t * freq)
            a, b = x[..., t, i], x[..., t, i + 2]
            expected[..., t, i], expected[..., t, i + 2] = a * c - b * s, a * s + b * c
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(out[..., 4:], x[..., 4:].float().double())
    partial, full = GPT(50, 16, tiny(rope_pct=0.25)), GPT(50, 16, tiny())
    partial.load_state_dict(full.state_dict())
    idx = torch.randint(0, 50, (2, 16))
    assert not torch.allclose(partial(idx), full(idx))  # the stack passes rope_pct through


@pytest.mark.parametrize("pct", [0.0, 1.5, 0.1])
def test_rope_pct_that_rotates_no_even_number_of_dims_is_refused(pct):
    with pytest.raises(ValueError, match="rope_pct"):
        RotaryEmbedding(16, 8, pct=pct)


# --- GPT ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("positions", ["rope", "learned", "none"])
@pytest.mark.parametrize("mlp", ["swiglu", "gelu", "relu2"])
def test_gpt_is_causal(positions, mlp):
    torch.manual_seed(0)
    model = GPT(50, 16, tiny(positions=positions, mlp=mlp)).eval()
    idx = torch.randint(0, 50, (2, 16))
    changed = idx.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % 50
    torch.testing.assert_close(model(idx)[:, :10], model(changed)[:, :10])
    assert not torch.allclose(model(idx)[:, 10:], model(changed)[:, 10:])


def test_relu2_mlp_is_relu_squared_at_width_4d():
    """modded-nanogpt's MLP: down(relu(up(x))^2), hidden 4d, as GELU's."""
    torch.manual_seed(0)
    cfg = tiny(mlp="relu2", bias=True)
    mlp = GPT(50, 16, cfg).stack.blocks[0].mlp
    assert mlp.up.weight.shape == (4 * cfg.d_model, cfg.d_model) == (cfg.resolved_mlp_hidden(), cfg.d_model)
    x = torch.randn(2, 5, cfg.d_model)
    expected = F.linear(F.relu(F.linear(x, mlp.up.weight, mlp.up.bias)) ** 2, mlp.down.weight, mlp.down.bias)
    torch.testing.assert_close(mlp(x), expected)


def test_weight_tying_and_init():
    model = GPT(100, 16, tiny(init_std=0.02, depth_scaled_init=True), tie_embeddings=True)
    assert model.head.weight is model.tok.weight
    out_std = model.stack.blocks[0].attn.out.weight.std().item()
    in_std = model.stack.blocks[0].attn.qkv.weight.std().item()
    assert abs(in_std - 0.02) < 0.003 and abs(out_std - 0.02 / math.sqrt(4)) < 0.002
    n_params = sum(p.numel() for p in model.parameters())
    untied = sum(p.numel() for p in GPT(100, 16, tiny()).parameters())
    assert untied - n_params == 100 * 32


def test_sequence_longer_than_context_is_refused():
    with pytest.raises(ValueError, match="exceeds block_size"):
        GPT(10, 8, tiny())(torch.zeros(1, 9, dtype=torch.long))


def test_generate_greedy_and_top1_agree():
    torch.manual_seed(0)
    model = GPT(20, 16, tiny()).eval()
    prompt = torch.randint(0, 20, (2, 3))
    greedy = model.generate(prompt, 6, temperature=0)
    top1 = model.generate(prompt, 6, temperature=1.0, top_k=1)
    assert greedy.shape == (2, 9) and torch.equal(greedy, top1) and torch.equal(greedy[:, :3], prompt)


def nanogpt_reference(model: GPT, idx: torch.Tensor) -> torch.Tensor:
    """GPT-2 written out by hand (nanoGPT's forward) on the model's own weights."""
    cfg, p = model.stack.cfg, dict(model.named_parameters())
    d, H = cfg.d_model, cfg.n_heads
    B, T = idx.shape
    x = p["tok.weight"][idx] + p["pos.weight"][:T]
    for i in range(cfg.n_layers):
        b = f"stack.blocks.{i}."
        h = F.layer_norm(x, (d,), p[b + "attn_in.weight"], p[b + "attn_in.bias"], 1e-5)
        q, k, v = F.linear(h, p[b + "attn.qkv.weight"], p[b + "attn.qkv.bias"]).split(d, dim=-1)
        q, k, v = (t.view(B, T, H, d // H).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // H)
        att = att.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, d)
        x = x + F.linear(y, p[b + "attn.out.weight"], p[b + "attn.out.bias"])
        h = F.layer_norm(x, (d,), p[b + "mlp_in.weight"], p[b + "mlp_in.bias"], 1e-5)
        h = F.gelu(F.linear(h, p[b + "mlp.up.weight"], p[b + "mlp.up.bias"]))
        x = x + F.linear(h, p[b + "mlp.down.weight"], p[b + "mlp.down.bias"])
    x = F.layer_norm(x, (d,), p["stack.final.weight"], p["stack.final.bias"], 1e-5)
    return x @ p["tok.weight"].T


def test_baseline_equals_handwritten_gpt2():
    torch.manual_seed(0)
    cfg = tiny(norm="layernorm", mlp="gelu", positions="learned", bias=True, n_layers=3)
    model = GPT(64, 24, cfg, tie_embeddings=True).eval()
    with torch.no_grad():  # non-trivial biases and norm gains, so every term is checked
        for name, param in model.named_parameters():
            if name.endswith("bias") or "_in.weight" in name or "final.weight" in name:
                param.normal_(0.0 if name.endswith("bias") else 1.0, 0.1)
    idx = torch.randint(0, 64, (3, 24))
    torch.testing.assert_close(model(idx), nanogpt_reference(model, idx), atol=1e-5, rtol=1e-5)


# --- Plugin hooks ---------------------------------------------------------------------------------

class Tag(nn.Module):
    """Identity that records its calls."""

    def __init__(self, log, key):
        super().__init__()
        self.log, self.key = log, key

    def forward(self, x):
        self.log.append(self.key)
        return x


CALLS: list = []


class RecordingNorm(NormStrategy):
    """Records every site the block asks for and every call."""

    def site(self, site, dim, layer, stack):
        return Tag(CALLS, (site, layer, dim))

    def constrains(self, role):
        return True


def test_block_calls_every_norm_site(plugin):
    plugin("norm", "recording", RecordingNorm)
    CALLS.clear()
    model = GPT(40, 8, tiny(norm="recording", mlp="swiglu", mlp_hidden=48))
    model(torch.randint(0, 40, (1, 8)))
    block_sites = [(s, 0) for s in Site.BLOCK]
    called = [(s, layer) for s, layer, _ in CALLS]
    assert called[0] == (Site.EMBEDDING, None) and called[-2:] == [(Site.FINAL, None), (Site.LOGITS, None)]
    order = [Site.ATTN_IN, Site.ATTN_OUT, Site.ATTN_AFTER_ADD, Site.MLP_IN, Site.MLP_HIDDEN, Site.MLP_OUT,
             Site.MLP_AFTER_ADD]
    assert called[1:8] == [(s, 0) for s in order] and set(called[1:8]) == set(block_sites)
    assert called[8:15] == [(s, 1) for s in order]
    dims = {s: dim for s, layer, dim in CALLS}
    assert dims[Site.MLP_HIDDEN] == 96 and dims[Site.LOGITS] == 40 and dims[Site.ATTN_IN] == 32


def test_constrained_weights_declare_their_d_model_axis(plugin):
    plugin("norm", "recording", RecordingNorm)
    model = GPT(40, 8, tiny(norm="recording", mlp="swiglu"))
    declared = {name: dim for name, _, dim in unit_norm_parameters(model)}
    assert declared["tok.weight"] == 1 and declared["head.weight"] == 1
    assert declared["stack.blocks.0.attn.qkv.weight"] == 1 and declared["stack.blocks.0.mlp.up.weight"] == 1
    assert declared["stack.blocks.0.attn.out.weight"] == 0 and declared["stack.blocks.1.mlp.down.weight"] == 0
    assert renormalize_(model) == len(declared) == 2 + 4 * 2
    for name, param, dim in unit_norm_parameters(model):
        torch.testing.assert_close(param.norm(dim=dim), torch.ones(param.shape[1 - dim]), msg=name)
    # The d_model axis is the one normalised: rows of (out, d) inputs, columns of (d, in) outputs.
    assert model.stack.blocks[0].attn.out.weight.shape[0] == 32


class GatedMerge(ResidualMerge):
    def __init__(self, log):
        super().__init__()
        self.log = log

    def forward(self, h, branch, history):
        self.log.append((len(history.states), len(history.branches), len(history.block_inputs)))
        return h + 0.5 * branch


class RecordingResidual(ResidualType):
    """Halves each branch and records what the history holds at each merge."""

    def merge(self, sublayer, layer, stack):
        return GatedMerge(CALLS)

    def reads_history(self, stack):
        return True


class UndeclaredReader(RecordingResidual):
    reads_history = ResidualType.reads_history  # reads the history without saying so


def test_residual_merges_see_the_history(plugin):
    plugin("residual", "recording", RecordingResidual)
    CALLS.clear()
    GPT(40, 8, tiny(residual="recording", n_layers=3))(torch.randint(0, 40, (1, 8)))
    # Before merge k (0-based) the history holds the embedding plus k states, k branches, and the blocks entered.
    assert CALLS == [(1 + k, k, k // 2 + 1) for k in range(6)]


def test_a_residual_that_reads_an_unrecorded_history_is_told_to_declare_it(plugin):
    # The stack records the history only for residuals that declare they read it (it costs activation memory).
    plugin("residual", "undeclared", UndeclaredReader)
    model = GPT(40, 8, tiny(residual="undeclared", n_layers=2))
    with pytest.raises(registry.PluginError, match="reads_history"):
        model(torch.randint(0, 40, (1, 8)))
    with model.stack.recording_history():  # what a probe does: then the history is there
        model(torch.randint(0, 40, (1, 8)))


class FFNProjection(ProjectionType):
    """Dense projections, and a bias-free single-matrix FFN in place of the MLP."""

    def linear(self, d_in, d_out, role, layer, stack, *, bias, init_std):
        return nn.Linear(d_in, d_out, bias=bias)

    def ffn(self, layer, stack, *, bias, init_std):
        return nn.Linear(stack.d_model, stack.d_model, bias=False)


def test_projection_may_define_the_ffn(plugin):
    plugin("projection", "ffn_proj", FFNProjection)
    model = GPT(40, 8, tiny(projection="ffn_proj"))
    assert type(model.stack.blocks[0].mlp) is nn.Linear
    assert model(torch.randint(0, 40, (1, 8))).shape == (1, 8, 40)
    # The default fused() builds q, k and v separately and concatenates them.
    assert len(model.stack.blocks[0].attn.qkv.parts) == 3


def test_constraints_need_a_projection_that_can_carry_them(plugin):
    plugin("norm", "recording", RecordingNorm)
    plugin("projection", "ffn_proj", FFNProjection)
    with pytest.raises(registry.PluginError, match="cannot declare constraints"):
        GPT(40, 8, tiny(norm="recording", projection="ffn_proj"))


def test_roles_that_write_to_the_stream():
    assert set(Role.WRITES_TO_STREAM) == {Role.ATTN_OUT, Role.MLP_OUT, Role.FFN}
