"""Clipped softmax and gated attention (Quantizable Transformers) on top of any norm strategy: off is the old model
on the fused path, on is the reference's formula."""

from __future__ import annotations

import math

import pytest
import torch

from arch_plugins import registry
from arch_plugins.interfaces import StackInfo
from arch_plugins.stabilisers.clipped_softmax import ClippedSoftmax
from arch_plugins.stabilisers.gated_attention import HeadGate
from lit.cli import main
from lit.models import GPT, TransformerConfig
from lit.models.transformer import TransformerStack
from tests.conftest import REPO

D, H, LAYERS, T, VOCAB = 16, 2, 2, 8, 13
BASELINE = str(REPO / "recipes" / "gpt_baseline.yaml")


def gpt(seed: int = 0, **arch) -> GPT:
    torch.manual_seed(seed)
    return GPT(VOCAB, T, TransformerConfig(**{"d_model": D, "n_layers": LAYERS, "n_heads": H, **arch}))


def test_off_keeps_the_fused_path_and_the_state_dict():
    plain = gpt()
    assert all(b.attn.probs is None and b.attn.gate is None for b in plain.stack.blocks)
    clipped = gpt(clipped_softmax_gamma=0.0)
    assert set(clipped.state_dict()) == set(plain.state_dict())  # the clipped softmax has no parameters


def test_clipped_softmax_at_gamma_0_zeta_1_is_the_softmax():
    plain, clipped = gpt(), gpt(clipped_softmax_gamma=0.0, clipped_softmax_zeta=1.0)
    clipped.load_state_dict(plain.state_dict())
    assert isinstance(clipped.stack.blocks[0].attn.probs, ClippedSoftmax)
    idx = torch.randint(0, VOCAB, (3, T))
    torch.testing.assert_close(clipped(idx), plain(idx), rtol=1e-5, atol=1e-5)
    scores = torch.randn(2, H, T, T) * 3
    assert torch.equal(ClippedSoftmax(0.0, 1.0)(scores), torch.softmax(scores, -1))


def test_clipped_softmax_is_the_references_formula_and_reaches_exact_zero_and_one():
    scores = torch.randn(4, H, T, T) * 4
    gamma, zeta = -0.1, 1.1
    expected = torch.clip(torch.softmax(scores, -1) * (zeta - gamma) + gamma, 0, 1)  # softmax.py's clipped_softmax
    out = ClippedSoftmax(gamma, zeta)(scores)
    torch.testing.assert_close(out, expected)
    assert (out == 0).any() and (out == 1).any()  # what the plain softmax cannot give from finite logits


def by_hand(attn, x, rope, gamma, zeta):
    B, _, d = x.shape
    q, k, v = attn.qkv(x).view(B, T, 3, H, d // H).permute(2, 0, 3, 1, 4)
    q, k = rope(q), rope(k)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(d // H)
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    weights = (torch.softmax(scores.masked_fill(future, -math.inf), -1) * (zeta - gamma) + gamma).clamp(0, 1)
    assert (weights[..., future] == 0).all()  # the clip keeps the future out, however gamma is set
    return attn.out((weights @ v).transpose(1, 2).reshape(B, T, d))


def test_clipped_attention_in_the_block_is_computed_as_the_paper():
    gamma, zeta = -12 / T, 1.05
    model = gpt(clipped_softmax_gamma=gamma, clipped_softmax_zeta=zeta)
    attn = model.stack.blocks[0].attn
    x = torch.randn(2, T, D)
    torch.testing.assert_close(attn(x, model.stack.rope), by_hand(attn, x, model.stack.rope, gamma, zeta),
                               rtol=1e-5, atol=1e-6)


def test_gate_init_is_the_references():
    gate = gpt(gated_attention=True).stack.blocks[0].attn.gate
    assert isinstance(gate, HeadGate) and gate.weight.shape == (H, D // H) and gate.bias.shape == (H,)
    torch.testing.assert_close(gate.bias, torch.full((H,), -math.log(3.0)))  # logit(0.25)
    assert gate.weight.abs().max() <= 1 / math.sqrt(D // H)  # nn.Linear(head_dim, 1)'s uniform bound
    assert gate.weight.std() > 0.1


def test_gate_with_a_zero_weight_scales_each_head_by_its_init():
    plain, gated = gpt(), gpt(gated_attention=True, gated_attention_init=0.3)
    gated.load_state_dict(plain.state_dict(), strict=False)
    attn_plain, attn_gated = plain.stack.blocks[0].attn, gated.stack.blocks[0].attn
    with torch.no_grad():
        attn_gated.gate.weight.zero_()
    x = torch.randn(2, T, D)
    torch.testing.assert_close(attn_gated(x, gated.stack.rope), 0.3 * attn_plain(x, plain.stack.rope))


def test_gate_equals_the_references_per_head_linears():
    """The reference's conditional_per_token gate: head h's nn.Linear(head_dim, 1) on its slice of the input."""
    torch.manual_seed(3)
    gate = HeadGate(H, D // H, 0.25)
    fcs = [torch.nn.Linear(D // H, 1) for _ in range(H)]
    with torch.no_grad():
        for h, fc in enumerate(fcs):
            fc.weight.copy_(gate.weight[h:h + 1])
            fc.bias.copy_(gate.bias[h:h + 1])
    x, y = torch.randn(2, T, D), torch.randn(2, H, T, D // H)
    heads = x.view(2, T, H, D // H).transpose(1, 2)  # (B, H, T, head_dim), the reference's _shape
    alpha = torch.stack([fcs[h](heads[:, h]) for h in range(H)], dim=1)  # (B, H, T, 1)
    torch.testing.assert_close(gate(x, y), y * torch.sigmoid(alpha))


@pytest.mark.parametrize("norm", registry.names("norm"))
def test_both_combine_with_every_norm_strategy(norm):
    arch = {"norm": norm, "clipped_softmax_gamma": -0.05, "gated_attention": True,
            "residual": "ngpt" if norm == "hypersphere" else "add",
            # 3PT partitions the width into phases that must divide this file's 2 heads.
            "norm_options": {"phases": 2} if norm == "3pt" else {}}
    model = gpt(**arch)
    logits = model(torch.randint(0, VOCAB, (2, T)))
    logits.float().square().mean().backward()
    assert torch.isfinite(logits).all()
    assert model.stack.blocks[0].attn.gate.weight.grad is not None


def test_they_compose_with_qk_norm_and_other_kinds():
    model = gpt(qk_norm="rmsnorm", logit_softcap=30.0, clipped_softmax_gamma=-0.1, clipped_softmax_zeta=1.02,
                gated_attention=True, residual="attnres_block", projection="pattention",
                projection_options={"tokens_qkv": 8, "tokens_out": 8, "tokens_ffn": 16})
    model(torch.randint(0, VOCAB, (2, T))).sum().backward()


def test_encoder_attention_is_not_masked():
    info = StackInfo(D, 1, H, 4 * D, causal=False)
    assert info.causal is False
    stack = TransformerStack(TransformerConfig(d_model=D, n_layers=1, n_heads=H, clipped_softmax_gamma=0.0,
                                               positions="none"), causal=False, max_len=T)
    plain = TransformerStack(TransformerConfig(d_model=D, n_layers=1, n_heads=H, positions="none"), causal=False,
                             max_len=T)
    plain.load_state_dict(stack.state_dict())
    x = torch.randn(2, T, D)
    torch.testing.assert_close(stack(x), plain(x), rtol=1e-5, atol=1e-5)


def test_bad_settings_are_one_line():
    for kw, message in [({"clipped_softmax_gamma": 0.1}, "gamma <= 0 and zeta >= 1"),
                        ({"clipped_softmax_gamma": -0.1, "clipped_softmax_zeta": 0.9}, "gamma <= 0 and zeta >= 1"),
                        ({"gated_attention": True, "gated_attention_init": 1.5}, "probability in \\(0, 1\\)")]:
        with pytest.raises(registry.PluginError, match=message):
            TransformerStack(TransformerConfig(d_model=D, n_layers=1, n_heads=H, **kw), causal=True, max_len=T)


def test_bad_gamma_from_the_command_line_is_one_error_line(capsys):
    with pytest.raises(SystemExit) as e:
        main(["fit", "--config", BASELINE, "--model.arch.clipped_softmax_gamma=0.2", "--trainer.fast_dev_run=true",
              "--trainer.logger=false"])
    assert e.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and "gamma <= 0" in err[0], err


def test_the_plugins_listing_names_the_stabilisers_by_their_real_fields():
    import dataclasses

    from lit.plugins_command import STABILISERS, listing

    fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    named = {name.strip() for names, _ in STABILISERS for name in names.split(",")}
    assert {"clipped_softmax_gamma", "gated_attention"} <= named <= fields
    assert "clipped softmax" in listing() and "gated attention" in listing()
