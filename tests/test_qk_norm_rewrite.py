"""QK-norm in the activations' dtype (issue 43, the review's section 2.10) computes what ``norm(q).to(q.dtype)``
computed: exactly in float32, and to bf16 rounding under bf16 autocast, where it no longer hands back a float32
tensor to be cast back.

``reference_forward`` is the version before the change (``QKNorm.forward`` at commit 34663c4).
"""

from __future__ import annotations

import copy

import pytest
import torch

from arch_plugins.stabilisers.qk_norm import QKNorm


def reference_forward(self, q, k):
    return self.q_norm(q).to(q.dtype), self.k_norm(k).to(k.dtype)


def pair(kind: str, seed: int = 0):
    """The module with non-trivial gains, its pre-change twin carrying the same gains, and q, k (B, H, T, hd)."""
    torch.manual_seed(seed)
    new = QKNorm(kind, head_dim=16, eps=1e-6)
    with torch.no_grad():
        for p in new.parameters():
            p.normal_(1.0, 0.3)
    old = copy.deepcopy(new)
    old.forward = reference_forward.__get__(old)
    q, k = torch.randn(2, 3, 5, 16) * 3, torch.randn(2, 3, 5, 16)
    return new, old, q, k


def run(module, q, k, autocast: bool):
    q, k = q.clone().requires_grad_(), k.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        # The projections' outputs under autocast are bf16: cast as a linear layer would hand them over.
        qn, kn = module(q.to(torch.bfloat16) if autocast else q, k.to(torch.bfloat16) if autocast else k)
        ((qn.float() * 1.7).sum() + (kn.float() * kn.float()).sum()).backward()
    return (qn, kn), (q.grad, k.grad), [p.grad for p in module.parameters()]


@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm"])
def test_in_float32_the_forward_and_every_gradient_are_bit_for_bit_the_old_ones(kind):
    new, old, q, k = pair(kind)
    got, want = run(new, q, k, autocast=False), run(old, q, k, autocast=False)
    for a, b in zip([*got[0], *got[1], *got[2]], [*want[0], *want[1], *want[2]], strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm"])
def test_under_bf16_autocast_the_output_stays_bf16_and_equals_the_old_to_bf16_rounding(kind):
    new, old, q, k = pair(kind, seed=1)
    got, want = run(new, q, k, autocast=True), run(old, q, k, autocast=True)
    for a, b in zip(got[0], want[0], strict=True):
        assert a.dtype == b.dtype == torch.bfloat16
        # The gains are rounded to bf16 before they multiply (relative 2**-9), and the product once more.
        torch.testing.assert_close(a.float(), b.float(), rtol=2 * 2**-8, atol=1e-2)
    for a, b in zip([*got[1], *got[2]], [*want[1], *want[2]], strict=True):
        # bf16 gradients, a layer norm's through a mean subtracted: 2% of the tensor's largest entry.
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2 * b.abs().max().item())


@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm"])
def test_under_bf16_autocast_the_norm_meets_gains_of_its_inputs_dtype(kind):
    """What the change is for: CUDA's fused norm kernels need input and weight of one dtype (mixed, they fall back
    to the composite and return float32). Seen at the torch function both versions call."""
    from torch.overrides import TorchFunctionMode

    class NormCalls(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.dtypes = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func in (torch.rms_norm, torch.layer_norm, torch.nn.functional.rms_norm,
                        torch.nn.functional.layer_norm):
                weight = args[2] if len(args) > 2 else (kwargs or {})["weight"]
                self.dtypes.append((args[0].dtype, weight.dtype))
            return func(*args, **(kwargs or {}))

    new, old, q, k = pair(kind)
    for module, same in ((new, True), (old, False)):
        with torch.autocast("cpu", dtype=torch.bfloat16), NormCalls() as seen:
            module(q.to(torch.bfloat16), k.to(torch.bfloat16))
        assert len(seen.dtypes) >= 2 and all((a == b) == same for a, b in seen.dtypes), seen.dtypes
