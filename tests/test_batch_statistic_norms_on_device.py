"""UN and PowerNorm decide their warmup and outlier branches on the device (``torch.where`` on the iteration
counter, no ``.item()``): the same numbers as before, bit for bit, and no host read.

The reference is a copy of each autograd function as it was before (commit 41e91a9), which read the counter on the
host (``int(iters.item())``) and branched in Python, as the authors' code does (``un.py``, ``pn.py``: see each
module's docstring). Both are run side by side over iterations that cross every boundary: the windows, the warmup,
the start of gradient compensation, and (UN, filtration on) an outlier batch; outputs, input and parameter
gradients and every buffer must be ``torch.equal`` at every step.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from arch_plugins.norms.batch_norm import processes
from arch_plugins.norms.powernorm import PowerNorm
from arch_plugins.norms.unified_norm import R_MAX, R_MIN, UnifiedNorm


class UNBefore(torch.autograd.Function):
    """``_UNFunction`` before: the counter and the outlier test read on the host. Its arithmetic follows today's
    function, whose ops issue 43 reordered to run fewer (the standard deviation once, one addcmul, the per-channel
    factors folded first): that reordering is compared with the older order, within rounding, in
    ``test_statistic_norms_rewrite.py``; here only where the branches are decided differs."""

    @staticmethod
    def forward(ctx, x, weight, bias, un):
        it = int(un.iters.item())
        fp, bp = un.buffer_x2.shape[0], un.buffer_gz.shape[0]
        world = processes() if un.sync else 1
        count = (un.reduce(torch.full((1,), float(x.shape[0]), device=x.device)) if world > 1
                 else float(x.shape[0]))
        x2 = un.reduce(x.square().sum(dim=0)) / count
        skip = fp <= 1
        recorded_var = torch.var(torch.sqrt(un.buffer_x2))
        un.buffer_x2[it % fp].copy_(x2)
        if it >= un.warmup_iters and un.outlier_filtration:
            am = un.buffer_x2.mean(dim=0)
            gm = torch.exp(torch.log(un.buffer_x2).mean(dim=0))
            if bool(((am - gm) > recorded_var * fp).any()):
                un.buffer_x2[it % fp].copy_(un.running_var)
                skip = True
                un.skip_counter += 1
        if it <= fp or it < un.warmup_iters or skip:
            var = x2
        else:
            var = torch.exp(torch.log(un.buffer_x2).mean(dim=0))
        std = (var + un.eps).sqrt()
        r = std / (un.running_var + un.eps).sqrt()
        if it <= max(un.compensation_start, un.warmup_iters) or skip:
            r = torch.ones_like(r)
        else:
            r = r.clamp(R_MIN, R_MAX)
        z = x / std
        un.running_var.copy_(un.momentum * un.running_var + (1 - un.momentum) * var)
        ctx.un, ctx.it, ctx.skip, ctx.bp, ctx.count, ctx.world = un, it, skip, bp, count, world
        ctx.save_for_backward(z, std, weight, r)
        return torch.addcmul(bias, weight, z)

    @staticmethod
    def backward(ctx, grad_y):
        un, it, skip, bp = ctx.un, ctx.it, ctx.skip, ctx.bp
        z, std, weight, r = ctx.saved_tensors
        g = grad_y * (weight * r)
        world = ctx.world
        gz = un.reduce((g * z).sum(dim=0)) / (ctx.count * world)
        un.buffer_gz[it % bp].copy_(un.ema_gz if skip else gz)
        if it <= bp or it < un.warmup_iters or skip:
            mean_gz = gz
        else:
            mean_gz = un.buffer_gz.mean(dim=0)
        un.ema_gz.copy_(un.ema_gz * un.momentum + (1 - un.momentum) * mean_gz)
        exact = skip or (un.exact_backward_warmup and it < un.warmup_iters)
        used = mean_gz if exact else un.ema_gz
        approx = g - (used * world if world > 1 else used) * z
        gx = approx / std
        return gx, (grad_y * z).sum(dim=0) * r, grad_y.sum(dim=0), None


class PowerBefore(torch.autograd.Function):
    """``_PowerFunction`` before: the counter read on the host. Its arithmetic follows today's function (fewer ops
    since issue 43: compared with the older order, within rounding, in ``test_statistic_norms_rewrite.py``)."""

    @staticmethod
    def forward(ctx, x, weight, bias, pn):
        it = int(pn.iters.item())
        world = processes() if pn.sync else 1
        count = (pn.reduce(torch.full((1,), float(x.shape[0]), device=x.device)) if world > 1
                 else float(x.shape[0]))
        var = pn.reduce(x.square().sum(dim=0)) / count
        if it <= pn.warmup_iters:
            z = x / (var + pn.eps).sqrt()
        else:
            z = x / (pn.running_phi + pn.eps).sqrt()
        if it < pn.warmup_iters:
            pn.running_phi.copy_(pn.running_phi * (it - 1) / it + var / it)
        pn.running_phi.copy_(pn.alpha_fwd * pn.running_phi + (1 - pn.alpha_fwd) * var)
        ctx.pn, ctx.count, ctx.world = pn, count, world
        ctx.save_for_backward(z, var, weight)
        return torch.addcmul(bias, weight, z)

    @staticmethod
    def backward(ctx, grad_y):
        pn = ctx.pn
        z, var, weight = ctx.saved_tensors
        g = grad_y * weight
        world = ctx.world
        approx = torch.addcmul(g, pn.ema_gz, z, value=-(1 - pn.alpha_bkw) * world)
        pn.ema_gz += pn.reduce((approx * z).sum(dim=0)) / (ctx.count * world)
        gx = approx / torch.sqrt(var + pn.eps)
        return gx, (grad_y * z).sum(dim=0), grad_y.sum(dim=0), None


def before(module: torch.nn.Module) -> torch.nn.Module:
    """``module`` running the old function (its forward's own steps, the counter's increment included, unchanged)."""
    import arch_plugins.norms.powernorm as pn_module
    import arch_plugins.norms.unified_norm as un_module

    owner, name, old = ((un_module, "_UNFunction", UNBefore) if isinstance(module, UnifiedNorm)
                        else (pn_module, "_PowerFunction", PowerBefore))
    forward = module.forward

    def forward_before(x):
        new = getattr(owner, name)
        setattr(owner, name, old)
        try:
            return forward(x)
        finally:
            setattr(owner, name, new)

    module.forward = forward_before
    return module


def batches(steps: int):
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        yield torch.randn(3, 5, 8, generator=g), torch.randn(3, 5, 8, generator=g)


def assert_step_by_step_identical(make, steps: int) -> dict[str, torch.Tensor]:
    new, old = make(), before(make())
    old.load_state_dict(new.state_dict())
    for step, (x, weights) in enumerate(batches(steps)):
        out = []
        for module in (new, old):
            xi = x.clone().requires_grad_(True)
            y = module(xi)
            (y * weights).sum().backward()
            out.append([y, xi.grad, *(p.grad for p in module.parameters()), *module.buffers()])
            module.zero_grad()
        for a, b in zip(*out, strict=True):
            assert torch.equal(a, b), f"step {step}"
    return dict(new.named_buffers())


@pytest.mark.parametrize(("filtration", "exact_warmup"), [(False, False), (True, False), (False, True)])
def test_un_on_the_device_is_the_host_branching_un_bit_for_bit(filtration, exact_warmup):
    # Window (3, 2), warmup 5, compensation from 7: 12 steps pass each boundary.
    buffers = assert_step_by_step_identical(
        lambda: UnifiedNorm(8, (3, 2), warmup_iters=5, outlier_filtration=filtration, compensation_start=7,
                            exact_backward_warmup=exact_warmup), steps=12)
    assert int(buffers["iters"]) == 12
    # Filtration's test runs from iteration 5: 8 batches, of which these tiny ones (15 tokens) are outliers in
    # some and not in others, so both sides ran.
    assert 0 < int(buffers["skip_counter"]) < 8 if filtration else int(buffers["skip_counter"]) == 0


@pytest.mark.parametrize("window", [1, (5, 4)], ids=["window_of_one", "windows_longer_than_the_warmup"])
def test_un_windows_decide_on_the_device_too(window):
    # A window of one never smooths; windows longer than the warmup (2) decide alone when smoothing starts.
    assert_step_by_step_identical(lambda: UnifiedNorm(8, window, warmup_iters=2, compensation_start=3), steps=8)


@pytest.mark.parametrize("warmup", [0, 1, 4])
def test_powernorm_on_the_device_is_the_host_branching_powernorm_bit_for_bit(warmup):
    assert_step_by_step_identical(lambda: PowerNorm(8, groups=2, warmup_iters=warmup), steps=7)


class HostReads(TorchDispatchMode):
    """Counts the aten ops whose result the host must wait for (``.item()``, ``bool(t)``, ``nonzero``...)."""

    READS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default,
             torch.ops.aten.is_nonzero.default, torch.ops.aten.equal.default}

    def __init__(self):
        super().__init__()
        self.reads = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in self.READS:
            self.reads.append(func)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("make", [lambda: UnifiedNorm(8, (3, 2), warmup_iters=2, outlier_filtration=True,
                                                      compensation_start=3),
                                  lambda: PowerNorm(8, groups=2, warmup_iters=2)], ids=["un", "powernorm"])
def test_no_host_read_in_training_forward_and_backward(make):
    module = make()
    with HostReads() as mode:
        for x, weights in batches(5):
            (module(x.requires_grad_(True)) * weights).sum().backward()
    assert mode.reads == []
