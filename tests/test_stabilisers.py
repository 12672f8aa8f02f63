"""QK-norm, logit soft-cap and z-loss on top of any norm strategy: off is the old model, on is the formula."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from arch_plugins import registry
from arch_plugins.interfaces import StackInfo
from arch_plugins.stabilisers import Stabilised, with_stabilisers
from arch_plugins.stabilisers.z_loss import z_loss
from lit.cli import main
from lit.errors import UserInputError
from lit.language_model import LanguageModel
from lit.models import GPT, TransformerConfig
from lit.models.transformer import TransformerStack
from tests.conftest import REPO, TINY_LM

D, LAYERS, T, VOCAB = 16, 2, 8, 13
BASELINE = str(REPO / "recipes" / "gpt_baseline.yaml")


def gpt(seed: int = 0, **arch) -> GPT:
    torch.manual_seed(seed)
    return GPT(VOCAB, T, TransformerConfig(**{"d_model": D, "n_layers": LAYERS, "n_heads": 2, **arch}))


def test_off_is_exactly_the_old_model():
    strategy = registry.create("norm", "rmsnorm")
    assert with_stabilisers(strategy, "rmsnorm") is strategy  # not even a wrapper
    model = gpt()
    assert not isinstance(model.stack.plugins.norm, Stabilised)
    assert all(block.attn.qk_before_rope is None for block in model.stack.blocks)
    assert isinstance(model.logits, torch.nn.Identity)
    assert not any("qk_before_rope" in n or "logits" in n for n in model.state_dict())


def attention_by_hand(attn, x: torch.Tensor, rope, norm_before_rope: bool) -> torch.Tensor:
    B, _, d = x.shape
    q, k, v = attn.qkv(x).view(B, T, 3, 2, d // 2).permute(2, 0, 3, 1, 4)
    qn, kn = attn.qk_before_rope.q_norm, attn.qk_before_rope.k_norm

    def norm(t, m):
        return t * torch.rsqrt(t.square().mean(-1, keepdim=True) + m.eps) * m.weight

    if norm_before_rope:
        q, k = rope(norm(q, qn)), rope(norm(k, kn))
    else:
        q, k = norm(rope(q), qn), norm(rope(k), kn)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(d // 2)
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf)
    return attn.out((scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, d))


def test_qk_norm_is_a_per_head_rmsnorm_before_rope():
    model = gpt(qk_norm="rmsnorm")
    attn = model.stack.blocks[0].attn
    with torch.no_grad():  # gains off 1: a per-channel gain does not commute with the rotation
        attn.qk_before_rope.q_norm.weight.normal_(1.0, 0.5)
        attn.qk_before_rope.k_norm.weight.normal_(1.0, 0.5)
    x = torch.randn(2, T, D)
    out = attn(x, model.stack.rope)
    torch.testing.assert_close(out, attention_by_hand(attn, x, model.stack.rope, True), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(out, attention_by_hand(attn, x, model.stack.rope, False), atol=1e-4)


def test_layernorm_qk_norm_has_no_bias():
    norm = gpt(qk_norm="layernorm").stack.blocks[0].attn.qk_before_rope.q_norm
    assert isinstance(norm, torch.nn.LayerNorm) and norm.bias is None and norm.normalized_shape == (D // 2,)


# Strategies that partition the width need options that fit this file's model (3PT: 2 phases of 2 heads here).
FITTING_OPTIONS = {"3pt": {"phases": 2}}


@pytest.mark.parametrize("norm", registry.names("norm"))
def test_qk_norm_and_softcap_combine_with_every_norm_strategy(norm):
    """Every strategy takes both, unless it transforms q and k itself (nGPT's hypersphere): one line then."""
    info = StackInfo(D, LAYERS, 2, 4 * D, causal=True)
    options = FITTING_OPTIONS.get(norm, {})
    strategy = registry.create("norm", norm, options)
    transforms_qk = strategy.qk(0, info) is not None or strategy.qk_before_rope(0, info) is not None
    arch = {"norm": norm, "norm_options": options, "qk_norm": "rmsnorm", "logit_softcap": 5.0}
    if transforms_qk:
        with pytest.raises(registry.PluginError, match="already transforms q and k") as info_:
            gpt(**arch)
        assert "\n" not in str(info_.value)
        return
    model = gpt(**arch)
    logits = model(torch.randint(0, VOCAB, (2, T)))
    assert torch.isfinite(logits).all() and logits.abs().max() < 5.0
    logits.sum().backward()
    assert model.stack.blocks[0].attn.qk_before_rope.q_norm.weight.grad is not None


@pytest.mark.parametrize("norm", ["rmsnorm", "hypersphere"])
def test_softcap_is_cap_tanh_of_the_strategys_logits(norm):
    arch = {"norm": norm, "residual": "ngpt" if norm == "hypersphere" else "add"}
    plain, capped = gpt(**arch), gpt(**arch, logit_softcap=2.0)
    capped.load_state_dict(plain.state_dict())  # the cap has no parameters: same weights, same keys
    idx = torch.randint(0, VOCAB, (2, T))
    torch.testing.assert_close(capped(idx), 2.0 * torch.tanh(plain(idx) / 2.0))
    # A cap far above every logit changes nothing measurable (tanh(x) = x - x^3 / 3 + ...).
    huge = gpt(**arch, logit_softcap=1e4)
    huge.load_state_dict(plain.state_dict())
    torch.testing.assert_close(huge(idx), plain(idx), rtol=0, atol=1e-6)


def test_stabilisers_compose_with_other_plugin_kinds():
    # QK-norm x Pattention projections x Attention Residuals; soft-cap and QK-norm both on.
    model = gpt(norm="layernorm_nonparam", projection="pattention", residual="attnres_block", qk_norm="rmsnorm",
                logit_softcap=30.0, projection_options={"tokens_qkv": 8, "tokens_out": 8, "tokens_ffn": 16})
    model(torch.randint(0, VOCAB, (2, T))).sum().backward()


def test_z_loss_by_hand():
    logits = torch.zeros(2, 3, 4)  # log sum exp = log 4 everywhere
    assert z_loss(logits).item() == pytest.approx(math.log(4) ** 2)
    logits = torch.tensor([[0.0, math.log(3.0)]])  # log(1 + 3) = log 4
    assert z_loss(logits).item() == pytest.approx(math.log(4) ** 2)


def training_loss(z: float) -> tuple[torch.Tensor, torch.Tensor, dict]:
    torch.manual_seed(0)
    model = LanguageModel(vocab_size=VOCAB, block_size=T, arch=TransformerConfig(d_model=D, n_layers=LAYERS,
                                                                                 n_heads=2), z_loss=z)
    logged = {}
    model.log_training_step = lambda loss, items: logged.setdefault("train/loss", loss)
    model.log = lambda name, value, **kw: logged.setdefault(name, value)
    idx = torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(1))
    loss = model.training_step((idx, idx), 0)
    return loss, F.cross_entropy(model(idx).flatten(0, 1), idx.flatten()), logged | {"logits": model(idx)}


def test_z_loss_is_added_to_the_training_loss_and_logged_apart():
    off, cross_entropy, logged = training_loss(0.0)
    assert torch.equal(off, cross_entropy) and "train/z_loss" not in logged  # off: exactly the old loss
    on, cross_entropy, logged = training_loss(1e-4)
    expected = 1e-4 * torch.logsumexp(logged["logits"], -1).square().mean()
    torch.testing.assert_close(logged["train/z_loss"], expected)
    torch.testing.assert_close(on, cross_entropy + expected)
    assert torch.equal(logged["train/loss"], cross_entropy)  # train/loss stays comparable across runs


def test_a_negative_z_loss_is_refused():
    with pytest.raises(UserInputError, match="z_loss is a coefficient"):
        LanguageModel(vocab_size=VOCAB, block_size=T, z_loss=-1.0)


def test_all_three_from_the_command_line(workdir):
    cli = main(["fit", "--config", BASELINE, *TINY_LM, "--trainer.max_steps=2", "--trainer.limit_val_batches=0",
                "--model.arch.qk_norm=rmsnorm", "--model.arch.logit_softcap=30", "--model.z_loss=1e-4",
                "--model.diagnostics.interval=0", "--trainer.logger=false",
                f"--trainer.default_root_dir={workdir}"])
    assert cli.trainer.callback_metrics["train/z_loss"] > 0
    model = cli.model.model
    assert model.stack.blocks[0].attn.qk_before_rope is not None and model.logits.cap == 30.0


def test_qk_norm_on_the_hypersphere_is_one_line_from_the_command_line(workdir, capsys):
    with pytest.raises(SystemExit) as e:
        main(["fit", "--config", BASELINE, "--model.arch.norm=hypersphere", "--model.arch.residual=ngpt",
              "--model.arch.qk_norm=rmsnorm", "--trainer.fast_dev_run=true", "--trainer.logger=false"])
    assert e.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and "norm 'hypersphere' already transforms q and k" in err[0], err


def test_stack_level_validation_is_one_line():
    for kw, message in [({"qk_norm": "l2"}, "qk_norm must be one of"), ({"logit_softcap": -3.0}, "positive number"),
                        ({"qk_norm": "rmsnorm", "qk_norm_eps": 0.0}, "qk_norm_eps must be positive")]:
        with pytest.raises(registry.PluginError, match=message):
            TransformerStack(TransformerConfig(d_model=D, n_layers=1, n_heads=2, **kw), causal=True, max_len=T)
