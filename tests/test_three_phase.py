"""3PT: equality with the reference's per-phase RMSNorm, rotation, horn and block order; the rotation is orthogonal;
the horn is fixed; the +1,536 parameters at the paper's 123M model; the errors; composition; GPT and ViT."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from arch_plugins import registry
from arch_plugins.diagnostics import declared_diagnostics
from arch_plugins.interfaces import Site, StackInfo
from arch_plugins.norms.three_phase import HornInjection, PhaseRMSNorm, PhaseRotation
from arch_plugins.registry import PluginError
from arch_plugins.weight_decay import decays
from lit.models import GPT, TransformerConfig
from lit.models.transformer import TransformerStack
from lit.models.vit import ViT

D, LAYERS, T = 24, 3, 8  # three phases of four (even, odd) pairs
INFO = StackInfo(D, LAYERS, 3, 4 * D, causal=True)

# --- the reference: achelousace/three-phase-transformer@161471dc8c28, ThreePhaseTransformer123M.py, ported with the
# number of phases as an argument (the file fixes NUM_PHASES = 3) -----------------------------------------------------


def reference_phase_rmsnorm(x, weights, phases=3, eps=1e-6):
    """RMSNorm (lines 324-331) per phase, PhaseAwareRMSNorm.forward (lines 340-342)."""
    chunks = x.chunk(phases, dim=-1)
    return torch.cat([c / torch.sqrt(c.pow(2).mean(-1, keepdim=True) + eps) * w
                      for c, w in zip(chunks, weights.chunk(phases), strict=True)], dim=-1)


def reference_rotation(x, theta, phases=3):
    """PhaseRotationLayer.forward (lines 422-435)."""
    d_phase = x.shape[-1] // phases
    chunks = list(x.chunk(phases, dim=-1))
    for i in range(phases):
        offset = i * (2 * math.pi / phases)
        p = chunks[i]
        x1, x2 = p[..., :d_phase:2], p[..., 1:d_phase:2]
        c, s = torch.cos(theta + offset), torch.sin(theta + offset)
        chunks[i] = torch.stack([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1).flatten(-2)
    return torch.cat(chunks, dim=-1)


def reference_horn(combined, phases=3):
    """ThreePhaseChannelStructureEmbedding: the buffer (lines 388-390) and forward (lines 392-404)."""
    d_phase = combined.shape[-1] // phases
    horn = (1.0 / (torch.arange(0, 1025, dtype=torch.float32) + 1.0)).view(1, 1025, 1)
    total_mean = sum(combined[:, :, i * d_phase:(i + 1) * d_phase].mean(dim=-1, keepdim=True)
                     for i in range(phases)) / phases
    return combined + (horn[:, :combined.shape[1], :] - total_mean)


def strategy(**options):
    return registry.create("norm", "3pt", options)


@pytest.mark.parametrize("phases", [1, 3])
def test_per_phase_rmsnorm_equals_the_reference(phases):
    torch.manual_seed(0)
    norm = PhaseRMSNorm(D, phases)
    with torch.no_grad():
        norm.weight.normal_(1.0, 0.3)
    x = 3.0 * torch.randn(2, T, D) + 1.0
    torch.testing.assert_close(norm(x), reference_phase_rmsnorm(x, norm.weight, phases), rtol=1e-5, atol=1e-6)
    # Each phase is normalised by its own RMS: scaling one phase leaves the output unchanged.
    scaled = x.clone()
    scaled[..., : D // 3] *= 50.0
    if phases == 3:
        torch.testing.assert_close(norm(scaled), norm(x), rtol=1e-4, atol=1e-5)
    assert sum(p.numel() for p in norm.parameters()) == D  # as many gains as one RMSNorm over d


def test_rotation_equals_the_reference_and_is_orthogonal():
    torch.manual_seed(0)
    rotation = PhaseRotation(D, 3, layer=1, num_layers=LAYERS)
    with torch.no_grad():
        rotation.theta.add_(0.5 * torch.randn_like(rotation.theta))
    x = torch.randn(2, T, D)
    y = rotation(x)
    torch.testing.assert_close(y, reference_rotation(x, rotation.theta), rtol=1e-6, atol=1e-6)
    # Norm-preserving within every phase (so overall), and the rotation by -theta undoes it.
    torch.testing.assert_close(y.unflatten(-1, (3, -1)).norm(dim=-1), x.unflatten(-1, (3, -1)).norm(dim=-1))
    jacobian = torch.autograd.functional.jacobian(rotation, torch.randn(D))
    torch.testing.assert_close(jacobian @ jacobian.T, torch.eye(D), rtol=0, atol=1e-6)
    assert not torch.allclose(jacobian, torch.eye(D), atol=1e-2)  # not vacuous: it does rotate
    # The fixed offsets: phase i turns by a further 2 pi i / 3 (120 degrees) than phase 0.
    pair = torch.zeros(D)
    pair[[0, 8, 16]] = 1.0  # the first channel of each phase's first pair
    out = rotation(pair).view(3, 8)[:, :2]
    angles = torch.atan2(out[:, 1], out[:, 0])
    turn = torch.remainder(angles - angles[0], 2 * math.pi)
    torch.testing.assert_close(turn, torch.tensor([0.0, 2 * math.pi / 3, 4 * math.pi / 3]), rtol=0, atol=1e-5)


def test_the_rotation_angles_start_on_the_depth_linear_schedule():
    for layer in range(LAYERS):
        rotation = strategy().site(Site.ATTN_AFTER_ADD, D, layer, INFO)
        assert rotation.theta.shape == (D // 3 // 2,)
        torch.testing.assert_close(rotation.theta, torch.full((4,), (layer + 1) * math.pi / (2 * LAYERS)))


def test_the_horn_is_a_fixed_profile_in_the_mean_direction():
    horn = HornInjection()
    assert not list(horn.parameters()) and not list(horn.buffers())  # nothing to train, nothing to save
    x = 5.0 * torch.randn(2, T, D) + 2.0
    y = horn(x)
    torch.testing.assert_close(y, reference_horn(x), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(y.mean(-1), (1.0 / torch.arange(1, T + 1)).expand(2, T), rtol=0, atol=1e-6)
    shift = y - x  # the same value on every channel: every direction orthogonal to the all-ones vector is untouched
    torch.testing.assert_close(shift, shift[..., :1].expand_as(shift))


def dc_share(x: torch.Tensor) -> torch.Tensor:
    """Each token's share of its energy in the all-ones (DC, horn) direction, per position."""
    return (x.mean(-1) ** 2 * x.shape[-1] / x.square().sum(-1)).mean(0)


def test_horn_scale_restores_the_reference_s_ratio_of_horn_to_tokens():
    # The reference adds 1/(p+1) to an N(0, 1) embedding; this project's embedding is N(0, 0.02^2). At horn_scale
    # 0.02 the per-phase RMSNorm that follows sees the reference's input, up to the common factor 0.02.
    torch.manual_seed(0)
    tokens = torch.randn(64, 128, 192)
    reference = reference_horn(tokens)
    scaled = strategy(horn_scale=0.02).site(Site.EMBEDDING, 192, None, StackInfo(192, 4, 6, 768, causal=True))
    torch.testing.assert_close(scaled(0.02 * tokens), 0.02 * reference, rtol=1e-5, atol=1e-7)
    as_written = HornInjection()(0.02 * tokens)  # the default: the horn 50x the tokens' relative size
    shares = {name: dc_share(x)[[0, 1, 10, 50]] for name, x in (("reference", reference), ("default", as_written))}
    assert shares["reference"][0] == pytest.approx(0.5, abs=0.1) and shares["reference"][2] < 0.05
    assert shares["default"][0] > 0.99 and shares["default"][3] > 0.3  # position 50 still half horn
    with pytest.raises(PluginError, match="horn_scale"):
        strategy(horn_scale=0)


def test_the_block_applies_the_pieces_where_the_reference_does():
    # Embedding -> horn; per block: h + attn(N1(h)), then the rotation (not residual), then h + ffn(N2(h)); N_f.
    torch.manual_seed(0)
    stack = TransformerStack(TransformerConfig(d_model=D, n_layers=LAYERS, n_heads=3, norm="3pt"), causal=True,
                             max_len=T)
    with torch.no_grad():
        for p in stack.parameters():
            if p.dim() == 1:
                p.add_(0.2 * torch.randn_like(p))
    x = torch.randn(2, T, D)
    h = reference_horn(x)
    for block in stack.blocks:
        h = h + block.attn(reference_phase_rmsnorm(h, block.attn_in.weight), stack.rope)
        h = reference_rotation(h, block.attn_after_add.theta)
        h = h + block.mlp(reference_phase_rmsnorm(h, block.mlp_in.weight))
    torch.testing.assert_close(stack(x), reference_phase_rmsnorm(h, stack.final.weight), rtol=1e-5, atol=1e-5)


def test_plus_1536_parameters_at_the_papers_123m_model():
    def count(norm: str) -> int:
        cfg = TransformerConfig(d_model=768, n_layers=12, n_heads=12, mlp="swiglu", mlp_hidden=2048, norm=norm)
        with torch.device("meta"):
            return sum(p.numel() for p in TransformerStack(cfg, causal=True, max_len=1024).parameters())

    assert count("3pt") - count("rmsnorm") == 1536 == 12 * 768 // (2 * 3)  # L * d / (2N): the rotation angles


def test_gpt_trains_and_the_horn_has_no_state():
    torch.manual_seed(0)
    gpt = GPT(vocab_size=11, block_size=T, arch=TransformerConfig(d_model=D, n_layers=2, n_heads=3, norm="3pt"))
    idx = torch.randint(0, 11, (2, T))
    F.cross_entropy(gpt(idx).flatten(0, 1), idx.flatten()).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for n, p in gpt.named_parameters() if "theta" in n)
    assert not any("horn" in k for k in gpt.state_dict())
    names = {name for name, _, _ in declared_diagnostics(gpt)}
    assert "stack.blocks.1.attn_after_add.theta" in names


@pytest.mark.parametrize("weight_decay", [True, False])
def test_angles_and_gains_decay_as_the_reference_unless_asked_not_to(weight_decay):
    stack = TransformerStack(TransformerConfig(d_model=D, n_layers=2, n_heads=3, norm="3pt",
                                               norm_options={"weight_decay": weight_decay}), causal=True, max_len=T)
    decay, named = decays(stack), dict(stack.named_parameters())
    for name in ("blocks.0.attn_after_add.theta", "blocks.1.mlp_in.weight", "final.weight"):
        assert decay[id(named[name])] is weight_decay, name


def test_vit_refuses_the_horn_and_trains_without_it():
    arch = {"d_model": D, "n_layers": 2, "n_heads": 3, "mlp": "gelu", "positions": "none", "norm": "3pt"}
    with pytest.raises(registry.PluginError, match="horn: false") as info:
        ViT(num_classes=3, image_size=8, patch_size=4, in_chans=1, arch=TransformerConfig(**arch))
    assert "\n" not in str(info.value)
    vit = ViT(num_classes=3, image_size=8, patch_size=4, in_chans=1,
              arch=TransformerConfig(**arch, norm_options={"horn": False}))
    vit(torch.randn(2, 1, 8, 8)).sum().backward()
    assert all(p.grad is not None for n, p in vit.named_parameters() if "theta" in n)


@pytest.mark.parametrize("arch, message", [
    ({"d_model": 20, "n_heads": 2}, "must be divisible by 6"),  # 20 channels: not three phases of pairs
    ({"d_model": 24, "n_heads": 4}, "n_heads=4 must be divisible by phases=3"),
])
def test_a_partition_that_does_not_fit_says_what_to_do(arch, message):
    with pytest.raises(registry.PluginError, match=message) as info:
        TransformerStack(TransformerConfig(n_layers=1, norm="3pt", **arch), causal=True, max_len=T)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("residual", ["hyperconn", "mhc"])  # the plain residual: every other test here
def test_composes_with_residuals_and_qk_norm(residual):
    torch.manual_seed(0)
    stack = TransformerStack(TransformerConfig(d_model=D, n_layers=2, n_heads=3, norm="3pt", residual=residual,
                                               qk_norm="rmsnorm"), causal=True, max_len=T)
    out = stack(torch.randn(2, T, D))
    out.square().mean().backward()
    assert torch.isfinite(out).all()
    assert all(p.grad is not None for n, p in stack.named_parameters() if "theta" in n)
