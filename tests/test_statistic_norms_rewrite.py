"""Issue 43: UN's and PowerNorm's autograd functions with fewer ops compute what the versions before them computed.

UN: the standard deviation computed once and saved, the token count a Python number on one process, the affine map
one addcmul, the per-channel factors folded before they meet the tokens. PowerNorm: the same token count and affine
map, and its backward's correction one addcmul with the scalar folded in.

``ReferenceUNFunction`` (copied from commit 717eef2) and ``ReferencePowerFunction`` (from 7fd9ab5) below are those
versions. Each pair runs the same 12 training steps from the same state, across every branch boundary (the windows
filling, the warmup, UN's gradient compensation, a spiked batch for its outlier filtration, its exact-backward
warmup), and is compared step by step: output, the gradients of the input and of both parameters, and every buffer.
The ops are reordered (``grad_y * (weight * r)`` against ``grad_y * weight * r``, an addcmul against a multiply and an
add), so the comparison is to fp32 rounding.
"""

from __future__ import annotations

import copy

import pytest
import torch

from arch_plugins.norms import powernorm, unified_norm
from arch_plugins.norms.powernorm import PowerNorm
from arch_plugins.norms.unified_norm import R_MAX, R_MIN, UnifiedNorm, processes  # noqa: F401 (used by the copies)

C = 6
ATOL, RTOL = 1e-6, 1e-5  # fp32 rounding of a few reordered ops on O(1) values


# ---- the version before the rewrite (commit 717eef2) ---------------------------------------------------------------

class ReferenceUNFunction(torch.autograd.Function):
    """Forward and approximate backward of UN on (N, C) tokens; buffers are updated in place.

    Every test of the reference's on the iteration counter and the outlier test reads its tensors where they live,
    on the device: both sides of each branch are computed and ``torch.where`` picks, elementwise, the values the
    reference's Python ``if`` picks (the same values, bit for bit), and the buffers' slot ``it % window`` is written
    by ``index_copy_``. No host read (a sync per forward on a GPU), no graph break under compile.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, un: UnifiedNorm):
        it = un.iters  # (1,), already counting this pass
        fp, bp = un.buffer_x2.shape[0], un.buffer_gz.shape[0]
        count = un.reduce(torch.full((1,), float(x.shape[0]), device=x.device))
        x2 = un.reduce(x.square().sum(dim=0)) / count
        skip = torch.full((1,), fp <= 1, dtype=torch.bool, device=x.device)
        slot = it % fp
        recorded_var = torch.var(torch.sqrt(un.buffer_x2))  # over the whole buffer, before this batch enters
        un.buffer_x2.index_copy_(0, slot, x2[None])
        if un.outlier_filtration:
            am = un.buffer_x2.mean(dim=0)
            gm = torch.exp(torch.log(un.buffer_x2).mean(dim=0))
            outlier = (it >= un.warmup_iters) & ((am - gm) > recorded_var * fp).any()
            un.buffer_x2.index_copy_(0, slot, torch.where(outlier, un.running_var, x2)[None])
            skip = skip | outlier
            un.skip_counter.add_(outlier.long())  # not +=, which also sets the attribute (see powernorm.py)
        geometric = torch.exp(torch.log(un.buffer_x2).mean(dim=0))  # the window's geometric mean
        var = torch.where((it <= fp) | (it < un.warmup_iters) | skip, x2, geometric)
        r = (var + un.eps).sqrt() / (un.running_var + un.eps).sqrt()
        r = torch.where((it <= max(un.compensation_start, un.warmup_iters)) | skip, torch.ones_like(r),
                        r.clamp(R_MIN, R_MAX))
        z = x / (var + un.eps).sqrt()
        un.running_var.copy_(un.momentum * un.running_var + (1 - un.momentum) * var)
        # What the backward's branches need, decided now: the counter moves on at the next forward.
        batch_gz = (it <= bp) | (it < un.warmup_iters) | skip
        exact = skip | (it < un.warmup_iters) if un.exact_backward_warmup else skip
        ctx.un, ctx.count = un, count
        ctx.save_for_backward(z, var, weight, r, it % bp, skip, batch_gz, exact)
        return weight * z + bias

    @staticmethod
    def backward(ctx, grad_y):
        un = ctx.un
        z, var, weight, r, slot, skip, batch_gz, exact = ctx.saved_tensors
        g = grad_y * weight * r
        # Kept at the whole batch's gradient scale, so the buffers do not depend on the number of processes; a
        # process's own gradients are `world` times that (see ``processes``).
        world = processes() if un.sync else 1
        gz = un.reduce((g * z).sum(dim=0)) / ctx.count / world
        un.buffer_gz.index_copy_(0, slot, torch.where(skip, un.ema_gz, gz)[None])
        mean_gz = torch.where(batch_gz, gz, un.buffer_gz.mean(dim=0))
        un.ema_gz.copy_(un.ema_gz * un.momentum + (1 - un.momentum) * mean_gz)
        # Where `exact`, mean_gz is the batch's gz (skip, or the warmup under exact_backward_warmup).
        approx = g - world * torch.where(exact, mean_gz, un.ema_gz) * z
        gx = approx / torch.sqrt(var + un.eps)
        return gx, (grad_y * r * z).sum(dim=0), grad_y.sum(dim=0), None


class ReferencePowerFunction(torch.autograd.Function):
    """Forward and approximate backward of PowerNorm on (N, C) tokens; buffers are updated in place."""

    @staticmethod
    def forward(ctx, x, weight, bias, pn: PowerNorm):
        # The warmup tests read the iteration counter where it lives, on the device: both sides of each branch are
        # computed and torch.where picks, elementwise, the same values the reference's Python `if` picks. No host
        # read of the counter (a sync per forward on a GPU), no graph break under compile.
        it = pn.iters.float()  # exact below 2**24 iterations
        count = pn.reduce(torch.full((1,), float(x.shape[0]), device=x.device))
        var = pn.reduce(x.square().sum(dim=0)) / count
        z = x / (torch.where(pn.iters <= pn.warmup_iters, var, pn.running_phi) + pn.eps).sqrt()
        # The cumulative average of the warmup, then (always) the EMA: pn.py:67-69. Divided by the counter as a
        # tensor: the same numbers on a CPU; on CUDA the host-int division it replaces was a multiplication by the
        # reciprocal (ATen's kernel for a host scalar), so the warmup average may differ there in the last bit.
        averaged = torch.where(pn.iters < pn.warmup_iters, pn.running_phi * (it - 1) / it + var / it, pn.running_phi)
        pn.running_phi.copy_(pn.alpha_fwd * averaged + (1 - pn.alpha_fwd) * var)
        ctx.pn, ctx.count = pn, count
        ctx.save_for_backward(z, var, weight)
        return weight * z + bias

    @staticmethod
    def backward(ctx, grad_y):
        pn = ctx.pn
        z, var, weight = ctx.saved_tensors
        g = grad_y * weight
        # ema_gz is kept at the whole batch's gradient scale, a process's own gradients are `world` times it (see
        # ``processes``), so the buffer does not depend on the number of processes.
        world = processes() if pn.sync else 1
        approx = g - (1 - pn.alpha_bkw) * world * pn.ema_gz * z
        # add_, not +=: += also sets the module's attribute, a side effect compile cannot keep inside the function.
        pn.ema_gz.add_(pn.reduce((approx * z).sum(dim=0)) / ctx.count / world)
        gx = approx / torch.sqrt(var + pn.eps)
        return gx, (grad_y * z).sum(dim=0), grad_y.sum(dim=0), None


# ---------------------------------------------------------------------------------------------------------------------

def close(actual, expected, msg):
    scale = max(1.0, expected.detach().abs().max().item())
    torch.testing.assert_close(actual, expected, atol=ATOL * scale, rtol=RTOL, msg=msg)


def step(un: torch.nn.Module, function, x: torch.Tensor, grad_y: torch.Tensor) -> dict[str, torch.Tensor]:
    """One training step of the norm ``un`` (UN or PowerNorm) through ``function``: output and the three
    gradients."""
    patch = pytest.MonkeyPatch()
    if isinstance(un, PowerNorm):
        patch.setattr(powernorm, "_PowerFunction", function)
    else:
        patch.setattr(unified_norm, "_UNFunction", function)
    try:
        x = x.clone().requires_grad_()
        un.weight.grad = un.bias.grad = None
        y = un(x)
        y.backward(grad_y)
    finally:
        patch.undo()
    return {"output": y.detach(), "input grad": x.grad, "weight grad": un.weight.grad, "bias grad": un.bias.grad}


def assert_steps_agree(new: torch.nn.Module, function, reference, scales: list[float]) -> torch.nn.Module:
    """Trains ``new`` through ``function`` and a copy of it through ``reference``, one step per input scale, and holds
    every step's output, gradients and buffers, then the eval output, equal to fp32 rounding. Returns the copy."""
    old = copy.deepcopy(new)
    for i, scale in enumerate(scales):
        x, grad_y = torch.randn(3, 5, C) * scale, torch.randn(3, 5, C)
        got, expected = step(new, function, x, grad_y), step(old, reference, x, grad_y)
        for name in expected:
            close(got[name], expected[name], f"step {i}: {name}")
        for (name, buffer), (_, kept) in zip(new.named_buffers(), old.named_buffers(), strict=True):
            close(buffer.float(), kept.float(), f"step {i}: buffer {name}")
    new.eval(), old.eval()
    x = torch.randn(2, 4, C)
    close(new(x), old(x), "eval")
    return old


@pytest.mark.parametrize("filtration", [False, True])
@pytest.mark.parametrize("exact_warmup", [False, True])
def test_un_with_fewer_ops_equals_the_version_before(filtration, exact_warmup):
    torch.manual_seed(0)
    new = UnifiedNorm(C, window_size=(3, 2), warmup_iters=4, outlier_filtration=filtration, compensation_start=5,
                      sync=False, exact_backward_warmup=exact_warmup)
    with torch.no_grad():
        new.weight.normal_(1.0, 0.3)
        new.bias.normal_(0.0, 0.3)
    # step 9: a batch far off the window's statistics
    old = assert_steps_agree(new, unified_norm._UNFunction, ReferenceUNFunction,
                             [30.0 if i == 9 else 1.0 + 0.2 * i for i in range(12)])
    assert int(new.skip_counter) == int(old.skip_counter) and (int(old.skip_counter) > 0) == filtration


@pytest.mark.parametrize("groups", [1, 2])
def test_powernorm_with_fewer_ops_equals_the_version_before(groups):
    torch.manual_seed(0)
    new = PowerNorm(C, groups=groups, warmup_iters=4, sync=False)
    with torch.no_grad():
        new.weight.normal_(1.0, 0.3)
        new.bias.normal_(0.0, 0.3)
    # the warmup's cumulative average, then the EMA alone
    assert_steps_agree(new, powernorm._PowerFunction, ReferencePowerFunction, [1.0 + 0.2 * i for i in range(10)])
    assert int(new.iters) > new.warmup_iters


def test_un_and_powernorm_with_fewer_ops_run_fewer_ops():
    """What the rewrite is for: fewer operator calls per training step (each a launch on a GPU)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.calls += 1
            return func(*args, **(kwargs or {}))

    def calls(norm: torch.nn.Module, function) -> int:
        Count.calls = 0
        with Count():
            step(norm, function, torch.randn(3, 5, C), torch.randn(3, 5, C))
        return Count.calls

    un = {"new": calls(UnifiedNorm(C, sync=False), unified_norm._UNFunction),
          "old": calls(UnifiedNorm(C, sync=False), ReferenceUNFunction)}
    assert un["new"] <= un["old"] - 8, un
    power = {"new": calls(PowerNorm(C, sync=False), powernorm._PowerFunction),
             "old": calls(PowerNorm(C, sync=False), ReferencePowerFunction)}
    assert power["new"] <= power["old"] - 4, power
