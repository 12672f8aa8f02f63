"""UN, PowerNorm and OSP's single-scale RMSNorm: each against its reference's formulas, step by step.

The UN and PowerNorm references are stateful (ring buffers, running statistics, EMAs of gradient statistics, an
iteration counter), so the checks below run a closed-form transcription of each reference's forward and
approximate backward, written in the reference's own (B, C, N, 1) layout, for several iterations across the warmup
boundaries, and compare outputs, gradients and every buffer at every step.
"""

from __future__ import annotations

import math

import pytest
import torch

from arch_plugins import registry
from arch_plugins.norms.powernorm import PowerNorm, _PowerFunction
from arch_plugins.norms.single_scale import SingleScaleRMSNorm
from arch_plugins.norms.unified_norm import UnifiedNorm
from lit.models import GPT, TransformerConfig
from lit.procedures.fold import fold_affine_norms

C, VOCAB, T = 8, 13, 8


def gpt(norm: str, seed: int = 0, **arch) -> GPT:
    torch.manual_seed(seed)
    return GPT(VOCAB, T, TransformerConfig(**{"d_model": 16, "n_layers": 2, "n_heads": 2, "norm": norm, **arch}))


# ---------------------------------------------------------------- UN


class UNByTheFormulas:
    """UN1d's training step as the reference computes it, on (B, C, N, 1) tensors, with its state held here."""

    def __init__(self, fp: int, bp: int, warmup: int, filtration: bool, eps=1e-5, momentum=0.9, start=1000):
        self.fp, self.bp, self.warmup, self.filtration = fp, bp, warmup, filtration
        self.eps, self.m, self.start = eps, momentum, start
        self.running_var = torch.ones(1, C, 1, 1)
        self.ema_gz = torch.zeros(1, C, 1, 1)
        self.buf_x2, self.buf_gz = torch.zeros(fp, C), torch.zeros(bp, C)
        self.iters, self.skips = 0, 0
        self.smoothed = self.compensated = False  # whether a step took each branch: the test must reach both

    def step(self, x4, weight, bias, grad_y4):
        self.iters += 1
        it = self.iters
        x2 = x4.pow(2).mean(dim=(0, 2, 3))
        skip = self.fp <= 1
        recorded = torch.sqrt(self.buf_x2).flatten().var()
        self.buf_x2[it % self.fp] = x2
        if it >= self.warmup and self.filtration:
            am, gm = self.buf_x2.mean(0), self.buf_x2.log().mean(0).exp()
            if ((am - gm) > recorded * self.fp).any():
                self.buf_x2[it % self.fp] = self.running_var.flatten()
                skip, self.skips = True, self.skips + 1
        plain = it <= self.fp or it < self.warmup or skip
        var = (x2 if plain else self.buf_x2.log().mean(0).exp()).view(1, C, 1, 1)
        self.smoothed |= not plain
        r = (var + self.eps).sqrt() / (self.running_var + self.eps).sqrt()
        r = torch.ones_like(r) if (it <= max(self.start, self.warmup) or skip) else r.clamp(0.2, 5.0)
        self.compensated |= bool((r != 1).any())
        z = x4 / (var + self.eps).sqrt()
        self.running_var = self.m * self.running_var + (1 - self.m) * var
        y = weight.view(1, C, 1, 1) * z + bias.view(1, C, 1, 1)
        # backward
        g = grad_y4 * weight.view(1, C, 1, 1) * r
        gz = (g * z).mean(dim=(0, 2, 3))
        self.buf_gz[it % self.bp] = self.ema_gz.flatten() if skip else gz
        mean_gz = gz if (it <= self.bp or it < self.warmup or skip) else self.buf_gz.mean(0)
        self.ema_gz = self.ema_gz * self.m + (1 - self.m) * mean_gz.view(1, C, 1, 1)
        used = mean_gz.view(1, C, 1, 1) if skip else self.ema_gz
        gx = (g - used * z) / (var + self.eps).sqrt()
        return y, gx, (grad_y4 * r * z).sum(dim=(0, 2, 3)), grad_y4.sum(dim=(0, 2, 3))


def to4(x):  # (B, N, C) -> the reference's (B, C, N, 1)
    return x.permute(0, 2, 1).unsqueeze(-1)


def from4(x4):
    return x4.squeeze(-1).permute(0, 2, 1)


@pytest.mark.parametrize("filtration", [False, True])
def test_un_matches_its_reference_step_by_step(filtration):
    """Warmup, then smoothing and compensated gradients (window 3 forward, 2 backward); a spiked batch triggers
    the outlier filtration where it is on."""
    torch.manual_seed(0)
    un = UnifiedNorm(C, window_size=(3, 2), warmup_iters=4, outlier_filtration=filtration, compensation_start=5,
                     sync=False)
    with torch.no_grad():
        un.weight.normal_(1.0, 0.3)
        un.bias.normal_(0.0, 0.3)
    ref = UNByTheFormulas(3, 2, 4, filtration, start=5)
    for step in range(12):
        scale = 30.0 if step == 9 else 1.0 + 0.2 * step  # step 9: a batch far off the window's statistics
        x = (torch.randn(3, 5, C) * scale).requires_grad_()
        grad_y = torch.randn(3, 5, C)
        un.weight.grad = un.bias.grad = None
        y = un(x)
        y.backward(grad_y)
        y_ref, gx_ref, gw_ref, gb_ref = ref.step(to4(x.detach()), un.weight.detach(), un.bias.detach(), to4(grad_y))
        torch.testing.assert_close(y, from4(y_ref), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(x.grad, from4(gx_ref), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(un.weight.grad, gw_ref, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(un.bias.grad, gb_ref)
        torch.testing.assert_close(un.running_var, ref.running_var.flatten())
        torch.testing.assert_close(un.ema_gz, ref.ema_gz.flatten(), rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(un.buffer_x2, ref.buf_x2)
    assert int(un.skip_counter) == ref.skips and (ref.skips > 0) == filtration
    assert ref.smoothed and ref.compensated  # the window's geometric mean and r != 1 were both exercised
    un.eval()  # inference: the running variance alone
    x = torch.randn(2, 4, C)
    torch.testing.assert_close(un(x), un.weight * x / (ref.running_var.flatten() + 1e-5).sqrt() + un.bias)


def test_un_backward_is_the_approximation_not_autograd():
    """At the first step (r = 1, ema_gz = 0.1 * mean(g z)) the approximate gradient differs from the exact one."""
    torch.manual_seed(1)
    x = torch.randn(4, 6, C, requires_grad=True)
    grad_y = torch.randn(4, 6, C)
    un = UnifiedNorm(C, sync=False)
    un(x).backward(grad_y)
    exact_x = x.detach().requires_grad_()
    flat = exact_x.reshape(-1, C)
    (flat / (flat.square().mean(0) + 1e-5).sqrt()).reshape(x.shape).backward(grad_y)
    g = grad_y.reshape(-1, C)
    z = x.detach().reshape(-1, C) / (x.detach().reshape(-1, C).square().mean(0) + 1e-5).sqrt()
    by_hand = (g - 0.1 * (g * z).mean(0) * z) / (x.detach().reshape(-1, C).square().mean(0) + 1e-5).sqrt()
    torch.testing.assert_close(x.grad, by_hand.reshape(x.shape))
    assert not torch.allclose(x.grad, exact_x.grad, atol=1e-3)


def test_un_exact_backward_warmup_is_autograd_during_the_warmup_and_the_reference_after():
    """The named deviation: while it < warmup_iters the input gradient is the forward's exact one; the buffers and
    the EMA follow the reference's updates, so from the warmup's end the two runs' gradients agree again."""
    torch.manual_seed(2)
    options = dict(window_size=2, warmup_iters=3, compensation_start=100, sync=False)
    exact, reference = UnifiedNorm(C, exact_backward_warmup=True, **options), UnifiedNorm(C, **options)
    for step in range(6):
        x, grad_y = torch.randn(4, 6, C), torch.randn(4, 6, C)
        grads = []
        for un in (exact, reference):
            xs = x.clone().requires_grad_()
            un(xs).backward(grad_y)
            grads.append(xs.grad)
        by_autograd = x.clone().requires_grad_()
        flat = by_autograd.reshape(-1, C)
        (flat / (flat.square().mean(0) + 1e-5).sqrt()).reshape(x.shape).backward(grad_y)
        it = step + 1  # the counter the forward saw
        if it < 3:
            torch.testing.assert_close(grads[0], by_autograd.grad, rtol=1e-4, atol=1e-6)
            assert not torch.allclose(grads[1], by_autograd.grad, atol=1e-3)
        else:
            torch.testing.assert_close(grads[0], grads[1])
        torch.testing.assert_close(exact.ema_gz, reference.ema_gz)  # the state evolves as the reference's


def test_un_at_inference_is_its_folded_linear():
    model = gpt("un", norm_options={"warmup_iters": 2, "window_size": 2})
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(5):
        idx = torch.randint(0, VOCAB, (4, T + 1))
        torch.nn.functional.cross_entropy(model(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten()).backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    assert model.stack.blocks[0].attn_in.running_var.sub(1).abs().max() > 0.01  # statistics moved
    idx = torch.randint(0, VOCAB, (2, T))
    before = model(idx)
    assert fold_affine_norms(model) == 5  # 2 blocks x 2 sites + the final norm
    assert not any(isinstance(m, UnifiedNorm) for m in model.modules())
    torch.testing.assert_close(model(idx), before, rtol=1e-4, atol=1e-4)


def test_un_defaults_follow_the_kind_of_stack():
    strategy = registry.create("norm", "un")
    lm = gpt("un").stack.blocks[0].attn_in
    vit_info = gpt("un").stack.info.__class__(16, 2, 2, 64, causal=False)
    vit = strategy.site("attn_in", 16, 0, vit_info)
    assert (lm.outlier_filtration, vit.outlier_filtration) == (False, True)
    assert (lm.warmup_iters, lm.eps, lm.momentum, lm.buffer_x2.shape[0], lm.buffer_gz.shape[0]) == (4000, 1e-5, 0.9,
                                                                                                   4, 4)
    with pytest.raises(registry.PluginError, match="window_size"):
        registry.create("norm", "un", {"window_size": [0, 2]})


# ---------------------------------------------------------------- PowerNorm


class PowerNormByTheFormulas:
    """MaskPowerNorm's training step as the reference computes it: group scaling on (T, B, C), then the
    PowerFunction on (B, C, T, 1)."""

    def __init__(self, groups, warmup, eps=1e-5, afwd=0.9, abkw=0.9):
        self.groups, self.warmup, self.eps, self.afwd, self.abkw = groups, warmup, eps, afwd, abkw
        self.phi = torch.ones(1, C, 1, 1)
        self.ema_gz = torch.zeros(1, C, 1, 1)
        self.iters = 0

    def group_scale(self, x_tbc):
        T_, B, _ = x_tbc.shape
        g = x_tbc.reshape(T_, B, self.groups, C // self.groups)
        m2 = (g * g).mean(dim=3, keepdim=True).repeat_interleave(C // self.groups, dim=-1).reshape(T_, B, C)
        return x_tbc / torch.sqrt(m2 + 1e-5)

    def step(self, s4, weight, bias, grad_y4):
        """On the group-scaled input s4 (B, C, T, 1): output, and the gradient w.r.t. s4, weight and bias."""
        self.iters += 1
        it = self.iters
        var = s4.pow(2).mean(dim=(0, 2, 3)).view(1, C, 1, 1)
        z = s4 / (var + self.eps).sqrt() if it <= self.warmup else s4 / (self.phi + self.eps).sqrt()
        if it < self.warmup:
            self.phi = self.phi * (it - 1) / it + var / it
        self.phi = self.afwd * self.phi + (1 - self.afwd) * var
        y = weight.view(1, C, 1, 1) * z + bias.view(1, C, 1, 1)
        g = grad_y4 * weight.view(1, C, 1, 1)
        approx = g - (1 - self.abkw) * self.ema_gz * z
        self.ema_gz = self.ema_gz + (approx * z).mean(dim=(0, 2, 3), keepdim=True)
        gs = approx / (var + self.eps).sqrt()
        return y, gs, (grad_y4 * z).sum(dim=(0, 2, 3)), grad_y4.sum(dim=(0, 2, 3))


def test_powernorm_matches_its_reference_step_by_step():
    """Forward, the approximate backward and the running statistics, across the warmup boundary (3 iterations)."""
    torch.manual_seed(0)
    pn = PowerNorm(C, groups=2, warmup_iters=3, sync=False)
    with torch.no_grad():
        pn.weight.normal_(1.0, 0.3)
        pn.bias.normal_(0.0, 0.3)
    ref = PowerNormByTheFormulas(groups=2, warmup=3)
    for step in range(7):
        x_btc = (torch.randn(3, 5, C) * (1 + step)).requires_grad_()
        grad_y = torch.randn(3, 5, C)
        pn.weight.grad = pn.bias.grad = None
        y = pn(x_btc)
        y.backward(grad_y)
        # The reference's layout: T x B x C in, group scaling there, then B x C x T x 1 for the PowerFunction.
        x_tbc = x_btc.detach().transpose(0, 1).requires_grad_()
        s_tbc = ref.group_scale(x_tbc)
        s4 = s_tbc.detach().permute(1, 2, 0).unsqueeze(-1)
        y4, gs4, gw, gb = ref.step(s4, pn.weight.detach(), pn.bias.detach(), grad_y.permute(0, 2, 1).unsqueeze(-1))
        s_tbc.backward(gs4.squeeze(-1).permute(2, 0, 1))  # through the group scaling by autograd, as there
        torch.testing.assert_close(y, y4.squeeze(-1).permute(0, 2, 1), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(x_btc.grad, x_tbc.grad.transpose(0, 1), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(pn.weight.grad, gw, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(pn.bias.grad, gb)
        torch.testing.assert_close(pn.running_phi, ref.phi.flatten())
        torch.testing.assert_close(pn.ema_gz, ref.ema_gz.flatten(), rtol=1e-4, atol=1e-6)
    pn.eval()
    x = torch.randn(2, 4, C)
    s = ref.group_scale(x.transpose(0, 1)).transpose(0, 1)
    torch.testing.assert_close(pn(x), pn.weight * s / (ref.phi.flatten() + 1e-5).sqrt() + pn.bias)


def test_powernorm_backward_closed_form_at_the_first_step():
    """ema_gz = 0 at the start, so the first input gradient is grad_y * weight / sqrt(x2 + eps), with no term for
    the statistic; autograd through the same forward has one, so the two differ."""
    torch.manual_seed(2)
    pn = PowerNorm(C, groups=1, warmup_iters=10, sync=False)
    with torch.no_grad():
        pn.weight.normal_(1.0, 0.3)
    s = torch.randn(4, 6, C)
    s = s / s.square().mean(-1, keepdim=True).add(1e-5).sqrt()  # already group-scaled: scaling again is identity
    s_in = s.clone().requires_grad_()
    grad_y = torch.randn(4, 6, C)
    scaled = pn.group_scaling(s_in)
    flat = scaled.reshape(-1, C)
    pn.iters += 1
    _PowerFunction.apply(flat, pn.weight, pn.bias, pn).reshape(s.shape).backward(grad_y)
    x2 = s.reshape(-1, C).square().mean(0)
    expected_scaled_grad = (grad_y * pn.weight.detach()).reshape(-1, C) / (x2 + 1e-5).sqrt()
    exact = s.clone().requires_grad_()
    f = exact.reshape(-1, C)
    (f / (f.square().mean(0) + 1e-5).sqrt() * pn.weight.detach()).reshape(s.shape).backward(grad_y)
    via_group = s.clone().requires_grad_()
    pn.group_scaling(via_group).backward(expected_scaled_grad.reshape(s.shape))
    torch.testing.assert_close(s_in.grad, via_group.grad, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(expected_scaled_grad.reshape(s.shape), exact.grad, atol=1e-3)


def test_powernorm_sites_and_defaults():
    model = gpt("powernorm")
    block = model.stack.blocks[0]
    assert isinstance(block.attn_in, PowerNorm) and isinstance(model.stack.final, PowerNorm)
    assert (block.attn_in.warmup_iters, model.stack.final.warmup_iters) == (8000, 1000)
    assert block.attn_in.group_scaling.groups == 2  # the heads
    assert (block.attn_in.alpha_fwd, block.attn_in.alpha_bkw, block.attn_in.eps) == (0.9, 0.9, 1e-5)
    with pytest.raises(ValueError, match="equal groups"):
        gpt("powernorm", norm_options={"group_num": 3})


# ---------------------------------------------------------------- OSP


def test_single_scale_rmsnorm_at_gain_one_is_rmsnorm_without_weight():
    x = torch.randn(3, 5, 16) * 4
    norm = SingleScaleRMSNorm()
    assert norm.scale.shape == () and norm.scale.item() == 1.0 and norm.eps == 1e-6
    torch.testing.assert_close(norm(x), torch.nn.RMSNorm(16, eps=1e-6, elementwise_affine=False)(x), rtol=0, atol=0)
    with torch.no_grad():
        norm.scale.fill_(2.5)
    torch.testing.assert_close(norm(x), 2.5 * torch.nn.functional.rms_norm(x, (16,), eps=1e-6))


def test_osp_embedding_projection_sits_after_the_embedding_and_before_the_head():
    plain, projected = gpt("ssnorm"), gpt("ssnorm", norm_options={"embedding_projection": True})
    assert isinstance(plain.stack.embedding, torch.nn.Identity)
    assert sum(p.numel() for p in projected.parameters()) - sum(p.numel() for p in plain.parameters()) == 2 * (
        16 * 16 + 16)
    first, last = projected.stack.embedding, projected.stack.final[1]
    for linear in (first, last):
        torch.testing.assert_close(linear.weight @ linear.weight.T, torch.eye(16), rtol=0, atol=1e-5)
        assert torch.equal(linear.bias, torch.zeros(16))
    assert isinstance(projected.stack.final[0], SingleScaleRMSNorm)
    # With identity projections the model is the plain one: the projections are the only difference.
    projected.load_state_dict(plain.state_dict(), strict=False)
    with torch.no_grad():
        for linear in (first, last):
            linear.weight.copy_(torch.eye(16))
    idx = torch.randint(0, VOCAB, (2, T))
    torch.testing.assert_close(projected(idx), plain(idx))


def test_osp_kurtosis_reads_the_final_state_at_the_norm_before_the_projection():
    from lit.diagnostics.outliers import excess_kurtosis
    from lit.diagnostics.probe import probe

    model = gpt("ssnorm", norm_options={"embedding_projection": True})
    with torch.no_grad():  # a projection that moves the kurtosis, so reading after it would show
        model.stack.final[1].weight.copy_(torch.diag(torch.linspace(0.1, 10.0, 16)))
    seen = {}
    model.stack.final[0].register_forward_hook(lambda m, a, out: seen.setdefault("norm", out.detach()))
    model.stack.register_forward_hook(lambda m, a, out: seen.setdefault("stack", out.detach()))
    metrics = probe(model, torch.randint(0, VOCAB, (2, T)), stream=False, attention=False, outliers=True)
    torch.testing.assert_close(metrics["diag/kurtosis/final"], excess_kurtosis(seen["norm"]))
    assert not torch.allclose(metrics["diag/kurtosis/final"], excess_kurtosis(seen["stack"]))
    # A plain final site is read at its own output, as before.
    plain = gpt("ssnorm")
    plain.stack.register_forward_hook(lambda m, a, out: seen.__setitem__("plain", out.detach()))
    metrics = probe(plain, torch.randint(0, VOCAB, (2, T)), stream=False, attention=False, outliers=True)
    torch.testing.assert_close(metrics["diag/kurtosis/final"], excess_kurtosis(seen["plain"]))


# ---------------------------------------------------------------- composition


@pytest.mark.parametrize("norm", ["un", "powernorm", "ssnorm"])
@pytest.mark.parametrize("residual", ["add", "hyperconn", pytest.param("laurel_rw", marks=pytest.mark.slow),
                                      pytest.param("attnres_block", marks=pytest.mark.slow)])
def test_composes_with_residual_types(norm, residual):
    options = {"un": {"warmup_iters": 1, "window_size": 2}, "powernorm": {"warmup_iters": 1},
               "ssnorm": {"embedding_projection": True}}[norm]
    model = gpt(norm, residual=residual, norm_options=options)
    for _ in range(3):
        logits = model(torch.randint(0, VOCAB, (2, T)))
        logits.square().mean().backward()
    assert torch.isfinite(logits).all()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)
    model.eval()
    assert torch.isfinite(model(torch.randint(0, VOCAB, (2, T)))).all()


def test_vit_takes_them():
    from lit.models.vit import ViT

    for norm in ("un", "powernorm", "ssnorm"):
        torch.manual_seed(0)
        model = ViT(num_classes=3, image_size=8, patch_size=4, in_chans=1,
                    arch=TransformerConfig(d_model=16, n_layers=1, n_heads=2, norm=norm))
        out = model(torch.randn(2, 1, 8, 8))
        out.sum().backward()
        assert out.shape == (2, 3) and math.isfinite(out.sum().item())
