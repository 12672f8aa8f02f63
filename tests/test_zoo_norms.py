"""BHyT, Pre-RMSNorm / Pre-CRMSNorm, PRepBN and the LayerNorm-free map: formulas against the references' equations on
hand-made tensors, schedules, the BHyT refresh, PRepBN's statistics and folding, composition with other plugins."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from arch_plugins.norms.batch_norm import SyncTokenBatchNorm
from arch_plugins.norms.bhyt import BHyTApproximate, BHyTExact, refresh_interval
from arch_plugins.norms.lnfree import CentredAffine
from arch_plugins.norms.prepbn import ProgressiveRepBN, schedule
from arch_plugins.norms.zero_mean import CRMSNorm, ZeroMeanRMSNorm
from arch_plugins.progress import TrainingProgress, advance, progress_hooks
from arch_plugins.registry import PluginError
from lit.models.gpt import GPT
from lit.models.transformer import TransformerConfig
from lit.procedures.fold import fold_affine_norms


def gpt(norm: str, options: dict | None = None, **arch) -> GPT:
    torch.manual_seed(0)
    cfg = dict(d_model=16, n_layers=2, n_heads=2, norm=norm, norm_options=options or {}, init_std=0.2)
    return GPT(13, 8, TransformerConfig(**{**cfg, **arch}))


TOKENS = torch.randint(0, 13, (3, 8), generator=torch.Generator().manual_seed(1))


# --- BHyT ------------------------------------------------------------------------------------------------------------

def test_bhyt_exact_is_the_reference_formula():
    x = torch.tensor([[1.0, -2.0, 3.0, 0.5], [0.1, 0.2, -0.3, 4.0]])
    module = BHyTExact(4, lam=2.0, kappa=10.0)
    module.weight.data = torch.tensor([1.0, 0.5, 2.0, -1.0])
    rstd = 1 / torch.sqrt((x ** 2).mean(-1, keepdim=True) + 1e-6) / 10.0  # rsqrt(mean(x^2) + 1e-6) / kappa
    torch.testing.assert_close(module(x), module.weight * torch.tanh(2.0 * rstd * x))


def test_bhyt_mlp_input_uses_the_variance_approximation_from_w_v_and_w_o():
    model = gpt("bhyt", {"lam_in": 1.5, "lam_post": 3.0, "kappa": 4.0})
    block, d = model.stack.blocks[0], 16
    seen = {}
    block.attn_in.register_forward_hook(lambda m, a, out: seen.__setitem__("x", a[0]))
    block.mlp_in.register_forward_hook(lambda m, a, out: seen.update(h=a[0], out=out))
    model(TOKENS)
    w_v, w_o = block.attn.qkv.weight[2 * d:], block.attn.out.weight
    c_attn = (w_v.T @ w_o.T).square().sum() / (8 * d)  # ||W_V^T W_O^T||_F^2 / (T d), T = 8 tokens
    torch.testing.assert_close(block.mlp_in.c_attn, c_attn.detach())
    var2 = seen["x"].square().mean(-1, keepdim=True) + c_attn * 1.5 ** 2 / 4.0 ** 2
    expected = torch.tanh(3.0 * seen["h"] / torch.sqrt(var2 + 1e-6) / 4.0)  # gains start at 1
    torch.testing.assert_close(seen["out"], expected)
    assert isinstance(model.stack.final, torch.nn.RMSNorm)  # final_lam 0: RMSNorm before the head, as the reference


def test_bhyt_refresh_interval_is_the_reference_callbacks():
    assert refresh_interval(500) == 10 and refresh_interval(10) == 1 and refresh_interval(10 ** 6) == 1000
    assert refresh_interval(None) == 500  # the reference takes 25000 steps when the length is unknown


def test_bhyt_refreshes_c_attn_on_schedule_only():
    model = gpt("bhyt")
    approx = model.stack.blocks[1].mlp_in
    values = []
    for step in range(25):
        advance(model, TrainingProgress(step, total_steps=500))  # every 10 steps
        model(TOKENS)
        values.append(approx.c_attn.item())
        with torch.no_grad():
            model.stack.blocks[1].attn.out.weight.mul_(1.01)  # an "optimizer step" that changes W_O
    assert approx.refreshes == 3  # steps 0, 10, 20
    changed = [step for step in range(1, 25) if values[step] != values[step - 1]]
    assert changed == [10, 20]


def test_bhyt_exact_option_has_no_approximation_and_nothing_to_refresh():
    model = gpt("bhyt", {"exact": True})
    assert all(isinstance(b.mlp_in, BHyTExact) for b in model.stack.blocks)
    assert not list(progress_hooks(model))


def test_bhyt_c_attn_is_kept_in_checkpoints():
    model = gpt("bhyt")
    model(TOKENS)
    restored = gpt("bhyt")
    with torch.no_grad():
        restored.stack.blocks[0].attn.out.weight.mul_(3.0)
    restored.load_state_dict(model.state_dict())
    assert not restored.stack.blocks[0].mlp_in.stale  # the loaded value is used, not recomputed
    torch.testing.assert_close(restored(TOKENS), model(TOKENS))


def test_bhyt_composes_with_pattention_only_exactly():
    with pytest.raises(PluginError, match="exact=true"):
        gpt("bhyt", projection="pattention")
    model = gpt("bhyt", {"exact": True}, projection="pattention")
    model(TOKENS).sum().backward()


# --- Pre-RMSNorm / Pre-CRMSNorm --------------------------------------------------------------------------------------

def reference_crms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """ZixuanJiang/pre-rmsnorm-transformer torch/customized_layer.py: crms_norm on x in R^{d-1}."""
    discarded = x.sum(dim=-1, keepdim=True)
    return x * torch.rsqrt((x.square().sum(dim=-1, keepdim=True) + discarded.square()) / (x.shape[-1] + 1) + eps)


def test_crmsnorm_is_the_reference_formula_on_the_first_d_minus_1_coordinates():
    x = torch.tensor([[1.0, -2.0, 3.0, 0.5, 7.0], [0.1, 0.2, -0.3, 4.0, -1.0]])
    out = CRMSNorm(5, eps=1e-5, affine=False)(x)
    kept = reference_crms_norm(x[:, :4], 1e-5)
    torch.testing.assert_close(out[:, :4], kept)
    torch.testing.assert_close(out[:, 4], -kept.sum(-1))


def test_on_zero_mean_vectors_rmsnorm_and_crmsnorm_are_layernorm():
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(0)) * 3
    x = x - x.mean(-1, keepdim=True)
    ln = F.layer_norm(x, (6,), eps=1e-5)
    torch.testing.assert_close(ZeroMeanRMSNorm(6, 1e-5, affine=False)(x), ln)
    torch.testing.assert_close(CRMSNorm(6, 1e-5, affine=False)(x), ln)
    # The last coordinate is never read: anything there gives the same output.
    torch.testing.assert_close(CRMSNorm(6, 1e-5, affine=False)(x + torch.tensor([0.0] * 5 + [9.0])), ln)


@pytest.mark.parametrize("norm", ["prermsnorm", "precrmsnorm"])
def test_pre_rms_models_compute_pre_ln_without_affine(norm):
    ln_model = gpt("layernorm", {"affine": False})
    model = gpt(norm)
    model.load_state_dict(ln_model.state_dict())
    with torch.no_grad():  # Pre-CRMSNorm reads d-1 coordinates of a stream that must start zero-mean
        for block in model.stack.blocks:
            for w in (block.attn.out.weight, block.mlp.down.weight):
                w -= w.mean(0, keepdim=True)
        model.tok.weight -= model.tok.weight.mean(1, keepdim=True)
    torch.testing.assert_close(model(TOKENS), ln_model(TOKENS), atol=1e-5, rtol=1e-5)


def test_pre_rmsnorm_keeps_the_stream_zero_mean_while_training():
    model = gpt("prermsnorm")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    for _ in range(3):
        F.cross_entropy(model(TOKENS).flatten(0, 1), TOKENS.flatten()).backward()
        optimizer.step()
        optimizer.zero_grad()
    stream = []
    model.stack.blocks[1].register_forward_hook(lambda m, a, out: stream.append(out))
    model(TOKENS)
    assert stream[0].abs().mean() > 0.1 and stream[0].mean(-1).abs().max() < 1e-5


# --- PRepBN ----------------------------------------------------------------------------------------------------------

def test_prepbn_schedule_endpoints():
    assert schedule(TrainingProgress(0, 100), 0.0, 0.8, 1.0) == (1.0, False)  # pure LayerNorm at step 0
    assert schedule(TrainingProgress(40, 100), 0.0, 0.8, 1.0) == (0.5, False)
    assert schedule(TrainingProgress(80, 100), 0.0, 0.8, 1.0) == (0.0, False)  # pure RepBN from the end on
    assert schedule(TrainingProgress(99, 100), 0.0, 0.8, 1.0) == (0.0, False)
    assert schedule(TrainingProgress(9, None), 10, 20, 1.0)[1]  # warmup in steps: LayerNorm alone
    assert schedule(TrainingProgress(20, None), 10, 20, 1.0) == (0.5, False)
    with pytest.raises(ValueError, match="fraction of the run"):
        schedule(TrainingProgress(5, None), 0.0, 0.8, 1.0)


def prepbn_site(**options) -> ProgressiveRepBN:
    model = gpt("prepbn", {"alpha_init": 0.7, "bn_zero_init": False, "base": "layernorm", **options})
    return model.stack.blocks[0].attn_in


def test_prepbn_is_layernorm_at_step_0_and_repbn_at_the_end():
    site = prepbn_site()
    x = torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(2)) * 2 + 1
    site.on_progress(TrainingProgress(0, 100))
    torch.testing.assert_close(site(x), F.layer_norm(x, (16,), eps=1e-6))
    site.on_progress(TrainingProgress(100, 100))
    batch_norm = F.batch_norm(x.reshape(-1, 16), None, None, training=True, eps=1e-6).reshape(x.shape)
    torch.testing.assert_close(site(x), batch_norm + 0.7 * x, atol=1e-5, rtol=1e-5)


def test_batch_statistics_and_running_statistics_match_batchnorm1d():
    ours, reference = SyncTokenBatchNorm(6, eps=1e-5), torch.nn.BatchNorm1d(6, eps=1e-5)
    for seed in range(3):
        x = torch.randn(4, 7, 6, generator=torch.Generator().manual_seed(seed)) * 3 + 2
        torch.testing.assert_close(ours(x).reshape(-1, 6), reference(x.reshape(-1, 6)), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.running_mean, reference.running_mean)
    torch.testing.assert_close(ours.running_var, reference.running_var)
    ours.eval(), reference.eval()
    x = torch.randn(5, 6)
    torch.testing.assert_close(ours(x), reference(x))


def test_prepbn_eval_uses_the_running_statistics():
    site = prepbn_site()
    site.on_progress(TrainingProgress(50, 100))
    for seed in range(4):
        site(torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(seed)) * 2 + 1)
    site.eval()
    bn = site.repbn.bn
    x = torch.randn(1, 3, 16)  # one sample: batch statistics would be another thing altogether
    expected = (x - bn.running_mean) / torch.sqrt(bn.running_var + bn.eps) * bn.weight + bn.bias + 0.7 * x
    torch.testing.assert_close(site(x), expected)
    assert bn.running_var.mean() > 2.0  # the inputs' variance (4), not the initial 1


def test_folded_prepbn_model_gives_the_same_logits():
    model = gpt("prepbn", {"alpha_init": 0.5, "bn_zero_init": False}, bias=False)
    with torch.no_grad():
        for seed in range(3):
            advance(model, TrainingProgress(60, 100))
            model(torch.randint(0, 13, (4, 8), generator=torch.Generator().manual_seed(seed)))
    model.eval()
    folded = copy.deepcopy(model)
    assert fold_affine_norms(folded) == 5  # 2 blocks x (attention, MLP) + the final norm
    assert not any(isinstance(m, ProgressiveRepBN) for m in folded.modules())
    torch.testing.assert_close(folded(TOKENS), model(TOKENS), atol=1e-5, rtol=1e-5)


def test_prepbn_composes_with_pattention_and_fold_refuses_it_in_one_line():
    model = gpt("prepbn", projection="pattention")
    advance(model, TrainingProgress(5, 10))
    model(TOKENS).sum().backward()
    with pytest.raises(Exception, match="dense linear layer"):
        fold_affine_norms(model.eval())


# --- LayerNorm-free --------------------------------------------------------------------------------------------------

def test_lnfree_site_is_layernorm_with_a_fixed_sigma_and_folds():
    site = CentredAffine(4)
    site.weight.data, site.bias.data = torch.tensor([1.0, 2.0, -1.0, 0.5]), torch.tensor([0.1, 0.0, 0.2, -0.3])
    x = torch.tensor([[1.0, -2.0, 3.0, 0.5]])
    torch.testing.assert_close(site(x), (x - x.mean()) * site.weight + site.bias)
    a, b = site.inference_affine()
    torch.testing.assert_close(x @ a.T + b, site(x))
    model = gpt("lnfree").eval()
    folded = copy.deepcopy(model)
    assert fold_affine_norms(folded) == 5
    torch.testing.assert_close(folded(TOKENS), model(TOKENS), atol=1e-5, rtol=1e-5)


def test_bhyt_lam_init_and_math_constants_are_the_references():
    model = gpt("bhyt")
    assert model.stack.blocks[0].attn_in.lam.item() == 2.0 and model.stack.blocks[0].mlp_in.lam.item() == 1.0
    assert math.isclose(1 / model.stack.blocks[0].attn_in.inv_kappa, 10.0)
    assert isinstance(model.stack.blocks[0].mlp_in, BHyTApproximate)


@pytest.mark.parametrize("norm,other", [("prermsnorm", dict(projection="pattention")),
                                        ("precrmsnorm", dict(residual="laurel_rw"))])
def test_pre_rms_strategies_compose_with_other_plugin_kinds(norm, other):
    model = gpt(norm, **other)
    model(TOKENS).sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
