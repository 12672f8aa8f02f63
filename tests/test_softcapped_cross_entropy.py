"""The soft-capped cross-entropy node (arch_plugins/stabilisers/softcapped_cross_entropy.py) and its use in the
chunked training loss: the plain form's loss and gradients, without the plain form's fp32 copies of the logits.

Tolerances: the same fp32 math with tanh and the softmax recomputed in backward and the sums in another order:
rtol 1e-6 on the sums, 1e-5 (atol 1e-7: gradients of order 1/vocab) on the gradients.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from arch_plugins.stabilisers.logit_softcap import LogitSoftCap, deferred_softcap
from arch_plugins.stabilisers.softcapped_cross_entropy import softcapped_cross_entropy_sums
from lit.models import GPT, TransformerConfig
from lit.readout_loss import IGNORE_INDEX, _chunk_sums, readout_loss

CAP = 5.0


def plain_sums(logits: torch.Tensor, targets: torch.Tensor, cap: float):
    """The reference: the cap as LogitSoftCap applies it, then F.cross_entropy and the z-loss's logsumexp."""
    capped = LogitSoftCap(cap)(logits)
    ce = F.cross_entropy(capped, targets, reduction="sum", ignore_index=IGNORE_INDEX)
    return ce, torch.logsumexp(capped, dim=-1).square().sum()


def logits_and_targets(rows: int = 9, vocab: int = 31, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logits = 4 * torch.randn(rows, vocab, generator=g)  # many beyond the cap, where tanh bends
    targets = torch.randint(0, vocab, (rows,), generator=g)
    targets[[1, 4]] = IGNORE_INDEX
    return logits, targets


def sums_and_grad(fn, logits, targets):
    logits = logits.clone().requires_grad_(True)
    ce, z = fn(logits, targets, CAP)
    (0.7 * ce + 0.3 * z).backward()  # both outputs' gradients, weighted apart
    return ce.detach(), z.detach(), logits.grad


def test_equals_the_plain_form_forward_and_backward():
    logits, targets = logits_and_targets()
    ce, z, grad = sums_and_grad(softcapped_cross_entropy_sums, logits, targets)
    ref_ce, ref_z, ref_grad = sums_and_grad(plain_sums, logits, targets)
    torch.testing.assert_close(ce, ref_ce, rtol=1e-6, atol=0)
    torch.testing.assert_close(z, ref_z, rtol=1e-6, atol=0)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-5, atol=1e-7)
    assert grad[1].abs().sum() > 0  # an ignored row still gets the z-loss's gradient


def test_each_output_alone():
    logits, targets = logits_and_targets(seed=1)
    for pick in (0, 1):
        got, ref = (logits.clone().requires_grad_(True) for _ in range(2))
        softcapped_cross_entropy_sums(got, targets, CAP)[pick].backward()
        plain_sums(ref, targets, CAP)[pick].backward()
        torch.testing.assert_close(got.grad, ref.grad, rtol=1e-5, atol=1e-7)


def test_bf16_logits_are_saved_as_they_are_and_get_a_bf16_gradient():
    logits, targets = logits_and_targets(seed=2)
    half = logits.bfloat16()
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        ce, z, grad = sums_and_grad(softcapped_cross_entropy_sums, half, targets)
    vocab_wide = [t for t in saved if t.shape[-1:] == logits.shape[-1:]]
    assert [t.dtype for t in vocab_wide] == [torch.bfloat16]
    assert grad.dtype == torch.bfloat16
    # against the plain form in fp32 from the same bf16 values: the gradient rounded to bf16 once
    ref_ce, ref_z, ref_grad = sums_and_grad(plain_sums, half.float(), targets)
    torch.testing.assert_close(ce, ref_ce, rtol=1e-6, atol=0)
    torch.testing.assert_close(grad.float(), ref_grad, rtol=2 ** -8, atol=1e-6)


def test_a_chunk_keeps_no_fp32_logits_for_backward():
    """What one chunk's computation (run again in backward, under checkpointing) saves: with the cap inside the
    node, the head's bf16 logits only; with the cap as its own module, fp32 copies of vocabulary width too."""
    torch.manual_seed(0)
    model = GPT(40, 8, TransformerConfig(d_model=16, n_layers=1, n_heads=2, logit_softcap=CAP))
    hidden, targets = torch.randn(6, 16), torch.randint(0, 40, (6,))

    def saved_vocab_wide(fn):
        found = []

        def pack(t):
            if t.shape[-1:] == (40,):
                found.append((t.dtype, t.numel() * t.element_size()))
            return t

        with torch.autocast("cpu", dtype=torch.bfloat16), \
                torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fn()
        return found

    fused = saved_vocab_wide(lambda: _chunk_sums(model.readout, hidden, targets, True))
    plain = saved_vocab_wide(lambda: plain_sums(model.readout(hidden), targets, CAP))
    assert [dtype for dtype, _ in fused] == [torch.bfloat16]
    assert torch.float32 in [dtype for dtype, _ in plain]
    assert sum(b for _, b in fused) < sum(b for _, b in plain) / 4


def test_the_cap_is_deferred_only_inside_the_block():
    cap = LogitSoftCap(2.0)
    x = torch.tensor([10.0])
    with deferred_softcap() as caps:
        assert torch.equal(cap(x), x)
    assert caps == [2.0]
    assert cap(x).item() == pytest.approx(2.0 * torch.tanh(torch.tensor(5.0)).item())


def test_chunked_softcapped_loss_under_bf16_autocast_equals_the_whole_logits_loss():
    """The chunked path (the cap inside the node) against the whole logits through the cap module, both under bf16
    autocast: the head's bf16 logits are the same, so the sums differ by fp32 rounding (rtol 1e-5); the gradients
    by bf16 rounding (below)."""
    torch.manual_seed(0)
    model = GPT(40, 8, TransformerConfig(d_model=16, n_layers=1, n_heads=2, logit_softcap=CAP))
    idx, targets = torch.randint(0, 40, (3, 8)), torch.randint(0, 40, (3, 8))
    results = []
    for chunk in (None, 5):
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ce, z = readout_loss(model.readout, model(idx, readout=False), targets, chunk, with_z=True)
        (ce + 0.1 * z).backward()
        results.append((ce.detach(), z.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (ce, z, grads), (ref_ce, ref_z, ref_grads) = results[1], results[0]
    torch.testing.assert_close(ce, ref_ce, rtol=1e-5, atol=0)
    torch.testing.assert_close(z, ref_z, rtol=1e-5, atol=0)
    for n, g in ref_grads.items():
        # the gradients come out of bf16 products (one over all tokens against one per chunk, summed in fp32): a
        # few bf16 roundings (2^-8 each) of the largest entry's size
        scale = g.abs().max().item()
        torch.testing.assert_close(grads[n], g, rtol=2 ** -6, atol=2 ** -6 * scale, msg=lambda m, n=n: f"{n}: {m}")
