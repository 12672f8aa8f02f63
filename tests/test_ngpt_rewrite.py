"""Issue 43: nGPT's normalisation and eigen-lerp with their derivatives written out compute what autograd computed.

The hypersphere norm strategy's ``l2_normalize`` and the nGPT residual's lerp now carry hand-written backwards (about
a third of the ops autograd's generic ones dispatch). Their forwards are the same kernels as before, so the outputs
must agree bit for bit; the gradients are the same formulas in another order, so to fp32 rounding (atol 1e-6 relative
to the tensor's scale, rtol 1e-5). The previous versions are copied below from commit c7f3728.
"""

from __future__ import annotations

from unittest import mock

import pytest
import torch
import torch.nn.functional as F

from arch_plugins.norms import hypersphere
from arch_plugins.norms.hypersphere import l2_normalize
from arch_plugins.residuals import ngpt
from arch_plugins.residuals.ngpt import EigenLerp

ATOL, RTOL = 1e-6, 1e-5


def previous_l2_normalize(x, eps=1e-12):
    x = x.to(torch.promote_types(x.dtype, torch.float32))
    return F.normalize(x, dim=-1, eps=eps)


def close(actual, expected, what):
    scale = max(1.0, expected.detach().abs().max().item())  # gradients through a tiny row's 1/|x| are large
    torch.testing.assert_close(actual, expected, atol=ATOL * scale, rtol=RTOL, msg=lambda m: f"{what}: {m}")


def grads(fn, inputs, seed=0):
    """fn's output and the gradients of a fixed random projection of it with respect to each input."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*leaves)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    (out.double() * g).sum().backward()
    return out, [t.grad for t in leaves]


def rows_around_the_bound(shape, eps, seed):
    """Random rows, with a zero row, a row under eps, one over it and one exactly at it (where torch's clamp_min
    passes no gradient to the norm)."""
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
    flat = x.view(-1, shape[-1])
    flat[0] = 0.0
    flat[1] *= eps / 10 / flat[1].norm()
    flat[2] *= eps * 10 / flat[2].norm()
    flat[3] = 0.0
    flat[3, 0] = eps  # |x| is eps exactly
    return x


@pytest.mark.parametrize("eps", [1e-12, 0.5])
@pytest.mark.parametrize("shape", [(2, 5, 24), (8, 48), (1, 4, 3, 16)])
def test_l2_normalize_closed_form_backward_equals_autograds(shape, eps):
    x = rows_around_the_bound(shape, eps, seed=1)
    assert x.view(-1, shape[-1])[3].norm() == torch.tensor(eps)  # in fp32, as clamp_min compares it
    new, new_grads = grads(lambda t: l2_normalize(t, eps), [x])
    old, old_grads = grads(lambda t: previous_l2_normalize(t, eps), [x])
    assert torch.equal(new, old)  # the same three forward kernels
    close(new_grads[0], old_grads[0], "grad x")


def test_l2_normalize_keeps_dtypes():
    """bf16 in (an attention or MLP output under autocast): fp32 out and a bf16 gradient, as through ``x.to``;
    fp64 stays fp64."""
    x = torch.randn(3, 4, 32, dtype=torch.bfloat16)
    new, (new_grad,) = grads(l2_normalize, [x])
    old, (old_grad,) = grads(previous_l2_normalize, [x])
    assert new.dtype == old.dtype == torch.float32 and new_grad.dtype == old_grad.dtype == torch.bfloat16
    assert torch.equal(new, old)
    torch.testing.assert_close(new_grad, old_grad, atol=1e-2, rtol=1e-2)  # bf16 rounding of fp32 gradients
    x64 = torch.randn(3, 32, dtype=torch.float64)
    new, (new_grad,) = grads(l2_normalize, [x64])
    old, (old_grad,) = grads(previous_l2_normalize, [x64])
    assert new.dtype == new_grad.dtype == torch.float64
    torch.testing.assert_close(new_grad, old_grad, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("shape, weight_shape", [((2, 5, 24), (24,)), ((7, 24), (24,)), ((3, 24), (3, 24))])
def test_lerp_written_out_equals_torch_lerp(shape, weight_shape):
    g = torch.Generator().manual_seed(2)
    h, branch = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
    weight = torch.rand(weight_shape, generator=g)
    new, new_grads = grads(ngpt._Lerp.apply, [h, branch, weight])
    old, old_grads = grads(torch.lerp, [h, branch, weight])
    assert torch.equal(new, old)
    for name, a, b in zip(("h", "branch", "weight"), new_grads, old_grads, strict=True):
        close(a, b, f"grad {name}")


@pytest.mark.parametrize("absolute", [True, False])
def test_eigen_lerp_merge_equals_its_previous_forward(absolute):
    """The merge with the signed or absolute step: output and the gradients of h, the branch and alpha."""
    merge = EigenLerp(24, init=0.05, scale=0.2, absolute=absolute, kernel="torch")
    with torch.no_grad():
        merge.alpha.stored.copy_(torch.randn(24, generator=torch.Generator().manual_seed(3)))
    g = torch.Generator().manual_seed(4)
    h, branch = torch.randn(2, 5, 24, generator=g), torch.randn(2, 5, 24, generator=g)

    def run(forward):
        merge.zero_grad()
        out, (gh, gb) = grads(lambda a, b: forward(a, b, None), [h, branch])
        return out, gh, gb, merge.alpha.stored.grad.clone()

    new = run(merge)
    old = run(lambda a, b, history: torch.lerp(a, b.to(a.dtype), merge.step_size().to(a.dtype)))
    assert torch.equal(new[0], old[0])
    for name, a, b in zip(("h", "branch", "alpha"), new[1:], old[1:], strict=True):
        close(a, b, f"grad {name}")


def test_ngpt_model_step_equals_the_previous_ops():
    """The nGPT recipe's whole model (hypersphere norm, nGPT residual, q/k scaling, s_uv, s_z) at a tiny width:
    loss and every parameter's gradient with the written-out backwards and with the previous ops patched back in."""
    from benchmarks.gpu_check.models import build_ours, fixed_batch, loss_of
    from benchmarks.plugin_cost import SHAPES, contenders

    shape = SHAPES["tiny"]
    spec = contenders(shape)["recipe=gpt_ngpt"]
    cpu = torch.device("cpu")

    def step():
        torch.manual_seed(5)
        model = build_ours(shape, cpu, **spec["arch"])
        x, y = fixed_batch(shape, cpu)
        loss = loss_of(model, x, y, cpu, False)
        loss.backward()
        return loss.detach(), {name: p.grad for name, p in model.named_parameters()}

    new_loss, new_grads = step()
    with mock.patch.object(hypersphere._UnitNorm, "apply", previous_l2_normalize), \
         mock.patch.object(ngpt._Lerp, "apply", torch.lerp):
        old_loss, old_grads = step()
    assert torch.equal(new_loss, old_loss)
    assert new_grads.keys() == old_grads.keys()
    for name in new_grads:
        close(new_grads[name], old_grads[name], f"grad {name}")
