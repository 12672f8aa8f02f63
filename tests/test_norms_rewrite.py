"""Issue 43 item 2: the hand-written norms moved onto fused native ops compute what they computed before.

Each ``reference_...`` below is the pre-rewrite version, copied from commit f9b8b5d (the last commit that touched
``arch_plugins/norms`` before the rewrite). The rewritten module is compared with it on the same inputs and
parameters: forward output and the gradients of the input and of every parameter in fp32, and for the batch-statistic
norms the running statistics after a few training steps and the eval-mode output. The ops differ (rsqrt-multiply
against sqrt-divide, a GEMV against a multiply and a sum, a complex multiply against four real ones), so the
comparison is to fp32 rounding: atol 1e-6 / rtol 1e-5 unless a line says otherwise.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from arch_plugins.norms.batch_norm import SyncTokenBatchNorm
from arch_plugins.norms.hypersphere import l2_normalize
from arch_plugins.norms.powernorm import GroupScaling, PowerNorm
from arch_plugins.norms.prepbn import RepBN
from arch_plugins.norms.seednorm import SeeDNorm
from arch_plugins.norms.single_scale import SingleScaleRMSNorm
from arch_plugins.norms.three_phase import PhaseRotation
from arch_plugins.norms.zero_mean import CRMSNorm, ZeroMeanRMSNorm

ATOL, RTOL = 1e-6, 1e-5  # fp32 rounding of a few differently ordered ops on O(1) values


def close(actual, expected, msg, atol=ATOL, rtol=RTOL):
    """assert_close with atol relative to the tensor's scale: gradients through a tiny row's 1/rms are in the
    hundreds, and an element that cancels to near zero among them carries their absolute rounding."""
    scale = max(1.0, expected.detach().abs().max().item()) if expected.numel() else 1.0
    torch.testing.assert_close(actual, expected, atol=atol * scale, rtol=rtol, msg=msg)


# ---- the pre-rewrite versions (commit f9b8b5d) ----------------------------------------------------------------------

def reference_single_scale_forward(self, x):
    xf = x.float()
    return (xf * torch.rsqrt(xf.square().mean(dim=-1, keepdim=True) + self.eps) * self.scale).to(x.dtype)


def reference_zero_mean_forward(self, x):
    xf = x.float()
    y = xf * torch.rsqrt(xf.square().mean(dim=-1, keepdim=True) + self.eps)
    return self.affine(y.type_as(x))


def reference_crms_forward(self, x):
    kept = x[..., :-1].float()
    total = kept.sum(dim=-1, keepdim=True)
    scale = torch.rsqrt((kept.square().sum(dim=-1, keepdim=True) + total.square()) / x.shape[-1] + self.eps)
    y = torch.cat([kept, -total], dim=-1) * scale
    return self.affine(y.type_as(x))


def reference_group_scaling_forward(self, x):
    grouped = x.reshape(*x.shape[:-1], self.groups, x.shape[-1] // self.groups)
    moment2 = grouped.square().mean(dim=-1, keepdim=True)
    return (grouped / torch.sqrt(moment2 + self.eps)).reshape(x.shape)


def reference_l2_normalize(x, eps=1e-12):
    x = x.to(torch.promote_types(x.dtype, torch.float32))
    return x * torch.rsqrt(x.square().sum(dim=-1, keepdim=True).clamp_min(eps * eps))


def reference_seednorm_forward(self, x):
    d = x.shape[-1]
    per_head = (x.unflatten(-1, (self.heads, d // self.heads)) * self.beta.view(self.heads, -1)).sum(-1)
    gate = torch.tanh(per_head * self.dot_scale)
    dynamic = (gate.unsqueeze(-1) * self.alpha.view(self.heads, -1)).flatten(-2)
    return F.rms_norm(x, (d,), eps=self.eps) * (self.drop(dynamic) + self.weight)


def reference_phase_rotation_forward(self, x):
    pairs = x.unflatten(-1, (self.phases, -1, 2))
    angle = self.theta + self.offsets.unsqueeze(-1)
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    even, odd = pairs[..., 0], pairs[..., 1]
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-3)


def reference_sync_token_batch_norm_forward(self, x):
    # The synchronised path, as it was: on one process the reductions are the identity.
    if not self.training:
        return self.affine_at_inference_apply(x)
    flat = x.reshape(-1, x.shape[-1]).float()
    count = torch.full((1,), float(flat.shape[0]), device=x.device)
    mean = flat.sum(dim=0) / count
    centred = flat - mean
    var = centred.square().sum(dim=0) / count
    with torch.no_grad():
        unbiased = var * (count / (count - 1).clamp(min=1))
        self.running_mean.lerp_(mean.detach().to(self.running_mean.dtype), self.momentum)
        self.running_var.lerp_(unbiased.detach().to(self.running_var.dtype), self.momentum)
    y = centred * torch.rsqrt(var + self.eps) * self.weight + self.bias
    return y.reshape(x.shape).to(x.dtype)


class _Reference(nn.Module):
    """Wraps a deep copy of a rewritten module and runs the pre-rewrite forward on it (same parameters, buffers)."""

    def __init__(self, module: nn.Module, forward):
        super().__init__()
        self.inner, self.reference_forward = copy.deepcopy(module), forward

    def forward(self, x):
        return self.reference_forward(self.inner, x)


def _randomise(module: nn.Module, seed: int) -> None:
    """Moves every parameter off its init (a zero beta or a unit gain would hide a wrong term)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.5 + (1.0 if p.dim() == 0 else 0.0))


def _input(shape, seed, dtype=torch.float32, scale=1.0, offset=0.0):
    """Random rows, the first of them scaled down to where a norm's eps is a visible share of its mean square."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64) * scale + offset
    x.view(-1, shape[-1])[0] *= 1e-3
    return x.to(dtype).requires_grad_()


def assert_same_function(new: nn.Module, old: nn.Module, x: torch.Tensor, *, atol=ATOL, rtol=RTOL, steps=1):
    """Output, input gradient and every parameter's gradient equal, ``steps`` times over (buffers may move)."""
    old_params = dict(old.named_parameters())
    for step in range(steps):
        xa, xb = x.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
        ya, yb = new(xa), old(xb)
        assert ya.dtype == yb.dtype and ya.shape == yb.shape
        close(ya, yb, lambda m, step=step: f"forward, step {step}: {m}", atol, rtol)
        g = torch.randn(ya.shape, generator=torch.Generator().manual_seed(100 + step)).to(ya.dtype)
        new.zero_grad(), old.zero_grad()
        (ya.float() * g.float()).sum().backward()
        (yb.float() * g.float()).sum().backward()
        close(xa.grad, xb.grad, lambda m, step=step: f"grad x, step {step}: {m}", atol, rtol)
        for name, p in new.named_parameters():
            q = old_params.get(name, old_params.get(f"inner.{name}"))
            close(p.grad, q.grad, lambda m, name=name, step=step: f"grad {name}, step {step}: {m}", atol, rtol)


SHAPES = [(2, 5, 24), (7, 48), (1, 3, 96)]


# ---- single-norm plugins ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", SHAPES)
def test_ssnorm_on_native_rms_norm_equals_the_hand_written_one(shape):
    new = SingleScaleRMSNorm(eps=1e-6)
    _randomise(new, 0)
    assert_same_function(new, _Reference(new, reference_single_scale_forward), _input(shape, 1, scale=3.0))


@pytest.mark.parametrize("affine", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_zero_mean_rms_norms_on_native_rms_norm_equal_the_hand_written_ones(shape, affine):
    for cls, reference in ((ZeroMeanRMSNorm, reference_zero_mean_forward), (CRMSNorm, reference_crms_forward)):
        new = cls(shape[-1], 1e-5, affine)
        _randomise(new, 2)
        assert_same_function(new, _Reference(new, reference), _input(shape, 3, offset=0.3))


@pytest.mark.parametrize("groups", [1, 4])
@pytest.mark.parametrize("shape", SHAPES)
def test_powernorm_group_scaling_on_native_rms_norm_equals_the_hand_written_one(shape, groups):
    new = GroupScaling(groups, eps=1e-5)
    assert_same_function(new, _Reference(new, reference_group_scaling_forward), _input(shape, 4, scale=2.0))


@pytest.mark.parametrize("eps", [1e-12, 1e-3])
@pytest.mark.parametrize("shape", SHAPES)
def test_l2_normalize_through_f_normalize_equals_the_hand_written_one(shape, eps):
    x = _input(shape, 5)
    with torch.no_grad():  # rows at, under and over the bound eps: the clamp's both sides and the zero vector
        x[..., 0, :] = 0.0
        if x.shape[-2] > 2:
            x[..., 1, :] *= eps / 10
            x[..., 2, :] *= eps * 10 / math.sqrt(shape[-1])
    wrap = lambda f: type("F", (nn.Module,), {"forward": lambda self, t: f(t, eps)})()  # noqa: E731
    assert_same_function(wrap(l2_normalize), wrap(reference_l2_normalize), x)


@pytest.mark.parametrize("heads, mean_dot", [(1, False), (4, True)])
@pytest.mark.parametrize("shape", SHAPES)
def test_seednorm_with_a_gemv_gate_and_fused_gain_equals_the_hand_written_one(shape, heads, mean_dot):
    new = SeeDNorm(shape[-1], heads=heads, alpha_init=1.0, eps=1e-6, mean_dot=mean_dot)
    _randomise(new, 6)
    assert_same_function(new, _Reference(new, reference_seednorm_forward), _input(shape, 7))


def test_seednorm_runs_on_the_meta_device():
    """A model built on the meta device (sharding, shape checks) runs forward there, as before the rewrite."""
    module = SeeDNorm(24).to("meta")
    assert module(torch.empty(2, 3, 24, device="meta")).shape == (2, 3, 24)


def test_seednorm_dropout_path_equals_the_hand_written_one():
    new = SeeDNorm(24, heads=1, dropout=0.3)
    _randomise(new, 8)
    old, x = _Reference(new, reference_seednorm_forward), _input((3, 4, 24), 9)
    for module in (new, old):
        module.train()
    torch.manual_seed(0)
    ya = new(x)
    torch.manual_seed(0)  # the same dropout mask: both draw it over the same (..., d) dynamic term
    yb = old(x)
    torch.testing.assert_close(ya, yb, atol=ATOL, rtol=RTOL)
    new.eval(), old.eval()
    assert_same_function(new, old, x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("phases, layer", [(1, 0), (3, 2)])
def test_3pt_rotation_as_a_complex_multiply_equals_the_givens_form(phases, layer, dtype):
    new = PhaseRotation(48, phases, layer, 4)
    _randomise(new, 10)
    x = _input((2, 5, 48), 11, dtype=dtype)
    assert_same_function(new, _Reference(new, reference_phase_rotation_forward), x)


def test_3pt_rotation_under_compile_takes_the_real_form():
    """Inductor fuses the real Givens form with its neighbours and would leave a complex multiply to eager kernels:
    the graph torch.compile captures holds no complex op, and computes what the eager complex form computes."""
    new = PhaseRotation(48, 3, 1, 4)
    _randomise(new, 17)
    captured = []

    def backend(gm, example_inputs):
        captured.extend(str(node.target) for node in gm.graph.nodes)
        return gm.forward

    x = _input((2, 5, 48), 18).detach()
    torch._dynamo.reset()
    compiled = torch.compile(new, backend=backend, fullgraph=True)
    close(compiled(x), new(x), lambda m: m)
    assert captured and not [t for t in captured if "complex" in t or "polar" in t], captured


def test_3pt_rotation_keeps_the_real_form_for_bf16():
    new = PhaseRotation(48, 3, 1, 4)
    x = _input((2, 5, 48), 12, dtype=torch.bfloat16)
    torch.testing.assert_close(new(x), reference_phase_rotation_forward(new, x), atol=0, rtol=0)  # the same ops


# ---- dtype under autocast --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("input_dtype", [torch.float32, torch.bfloat16])
def test_rewritten_norms_keep_their_dtypes_under_autocast(input_dtype):
    """Under bf16 autocast each rewritten module returns the dtype its old form returned, with its values (to bf16
    rounding where the output is bf16)."""
    d = 48
    cases = [(SingleScaleRMSNorm(), reference_single_scale_forward), (ZeroMeanRMSNorm(d, 1e-5, True),
             reference_zero_mean_forward), (CRMSNorm(d, 1e-5, True), reference_crms_forward),
             (GroupScaling(4), reference_group_scaling_forward), (SeeDNorm(d), reference_seednorm_forward),
             (PhaseRotation(d, 3, 0, 2), reference_phase_rotation_forward)]
    x = _input((2, 3, d), 13, dtype=input_dtype).detach()
    for i, (module, reference) in enumerate(cases):
        _randomise(module, 20 + i)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ya, yb = module(x), reference(module, x)
        assert ya.dtype == yb.dtype, type(module).__name__
        tol = 1e-2 if ya.dtype == torch.bfloat16 else 1e-5
        name = type(module).__name__
        torch.testing.assert_close(ya, yb, atol=tol, rtol=tol, msg=lambda m, name=name: f"{name}: {m}")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ya, yb = l2_normalize(x), reference_l2_normalize(x)
    assert ya.dtype == yb.dtype == torch.float32
    torch.testing.assert_close(ya, yb, atol=ATOL, rtol=RTOL)


# ---- batch-statistic norms: running statistics and eval outputs ------------------------------------------------------

@pytest.mark.parametrize("shape", [(4, 6, 12), (32, 12), (3, 1, 12), (1, 12)])
@pytest.mark.parametrize("sync", [True, False])
def test_token_batch_norm_on_native_batch_norm_equals_the_hand_written_one(shape, sync):
    """Four training steps (outputs, gradients, running mean and variance after each), then eval outputs."""
    new = SyncTokenBatchNorm(shape[-1], eps=1e-5, sync=sync)
    _randomise(new, 14)
    old = _Reference(new, reference_sync_token_batch_norm_forward)
    for step in range(4):
        x = _input(shape, 30 + step, scale=2.0, offset=0.5 * step)
        assert_same_function(new, old, x)
        torch.testing.assert_close(new.running_mean, old.inner.running_mean, atol=ATOL, rtol=RTOL)
        torch.testing.assert_close(new.running_var, old.inner.running_var, atol=ATOL, rtol=RTOL)
    assert_same_function(new.eval(), old.eval(), _input(shape, 40))


def test_repbn_over_the_native_batch_norm_equals_the_hand_written_one():
    new = RepBN(16, eps=1e-6, alpha_init=0.3, zero_init=False, sync=True)
    _randomise(new, 15)
    old = copy.deepcopy(new)
    old.bn.forward = reference_sync_token_batch_norm_forward.__get__(old.bn)
    for step in range(3):
        assert_same_function(new, old, _input((3, 7, 16), 50 + step, offset=1.0))
    torch.testing.assert_close(new.bn.running_var, old.bn.running_var, atol=ATOL, rtol=RTOL)
    assert_same_function(new.eval(), old.eval(), _input((3, 7, 16), 60))


def test_powernorm_over_native_group_scaling_equals_the_hand_written_one():
    """PowerNorm's own batch statistics are unchanged; its group scaling now runs on the native RMSNorm. Training
    steps on both sides of the warmup (running statistic, ema_gz, gradients), then eval outputs."""
    new = PowerNorm(24, groups=4, warmup_iters=2)
    _randomise(new, 16)
    old = copy.deepcopy(new)
    old.group_scaling.forward = reference_group_scaling_forward.__get__(old.group_scaling)
    for step in range(5):
        assert_same_function(new, old, _input((3, 5, 24), 70 + step, scale=1.5))
        for name in ("running_phi", "ema_gz", "iters"):
            torch.testing.assert_close(getattr(new, name), getattr(old, name), atol=ATOL, rtol=RTOL)
    assert_same_function(new.eval(), old.eval(), _input((3, 5, 24), 80))
