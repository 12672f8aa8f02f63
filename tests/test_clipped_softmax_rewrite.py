"""Issue 43 item 2, clipped softmax's interim change (../shared/specs/gpu-plugins.md §2.6): the block's explicit
attention and the clipped softmax in the compute dtype instead of an fp32 copy of the (B, H, T, S) scores.

``reference_clipped_softmax`` and ``reference_explicit_attention`` are the pre-change versions, copied from commit
fb52532 (the repository just before the change; both files unchanged there since their last commits). In fp32 the
two compute the same ops on the same values: equal to 1e-6 (atol and rtol; bit for bit on the machines tried, the
tolerance only for a backend that orders a reduction differently). In bf16 the new path rounds the weights to bf16
where the old one rounded them once before ``@ v``: compared at bf16's tolerance, written beside the check.
FlexAttention's two-pass form is not built (why: ``arch_plugins/stabilisers/clipped_softmax.py``'s docstring).
"""

from __future__ import annotations

import pytest
import torch

from lit.models import GPT, TransformerConfig

D, H, T = 32, 4, 12
ATOL = RTOL = 1e-6  # fp32: the same ops on the same values


def reference_clipped_softmax(self, scores):
    """ClippedSoftmax.forward at commit fb52532: the softmax on an fp32 copy."""
    stretched = torch.softmax(scores.float(), dim=-1) * (self.zeta - self.gamma) + self.gamma
    return stretched.clamp(0.0, 1.0)


def reference_explicit_attention(self, q, k, v):
    """Attention._explicit_attention at commit fb52532 (causal, no cache, no dropout): fp32 scores."""
    scale = self.scale if self.scale is not None else q.shape[-1] ** -0.5
    scores = (q @ k.transpose(-1, -2)).float() * scale
    T_, S = scores.shape[-2:]
    future = torch.ones(T_, S, dtype=torch.bool, device=scores.device).triu(S - T_ + 1)
    scores = scores.masked_fill(future, float("-inf"))
    weights = reference_clipped_softmax(self.probs, scores).to(v.dtype)
    return weights @ v


def attention(gamma: float, zeta: float = 1.0):
    torch.manual_seed(0)
    model = GPT(11, T, TransformerConfig(d_model=D, n_layers=1, n_heads=H, clipped_softmax_gamma=gamma,
                                         clipped_softmax_zeta=zeta))
    return model.stack.blocks[0].attn


def qkv(dtype=torch.float32, spread: float = 1.0):
    g = torch.Generator().manual_seed(1)
    return [(spread * torch.randn(2, H, T, D // H, generator=g)).to(dtype).requires_grad_(True) for _ in range(3)]


def out_and_grads(fn, tensors):
    tensors = [t.detach().clone().requires_grad_(True) for t in tensors]
    out = fn(*tensors)
    (out.float() * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    return out, [t.grad for t in tensors]


@pytest.mark.parametrize("gamma,zeta", [(-0.1, 1.0), (-12 / T, 1.05), (0.0, 1.0)])
def test_fp32_equals_the_old_path_forward_and_backward(gamma, zeta):
    attn = attention(gamma, zeta)
    tensors = qkv(spread=2.0)  # sharp rows, so that weights clip at both 0 and 1
    out, grads = out_and_grads(attn._explicit_attention, tensors)
    ref, ref_grads = out_and_grads(lambda q, k, v: reference_explicit_attention(attn, q, k, v), tensors)
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=RTOL)
    for name, g, r in zip("qkv", grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, atol=ATOL, rtol=RTOL, msg=lambda m, name=name: f"d{name}: {m}")


def test_a_row_whose_weights_all_clip_gives_zero_and_finite_gradients():
    """gamma = -2 (zeta 1): a weight survives only where p > 2/3, so most rows lose every weight: o = 0 there, and
    backward stays finite (the clamp passes no gradient, the softmax gets zeros)."""
    attn = attention(-2.0)
    tensors = qkv(spread=0.3)  # flat rows: no probability reaches 2/3 beyond the first query's single key
    out, grads = out_and_grads(attn._explicit_attention, tensors)
    dead = out[:, :, 1:].abs().amax(-1) == 0
    assert dead.all()
    assert out[:, :, 0].abs().sum() > 0  # the first query sees one key with p = 1, which does not clip
    assert all(torch.isfinite(g).all() for g in grads)
    ref, ref_grads = out_and_grads(lambda q, k, v: reference_explicit_attention(attn, q, k, v), tensors)
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=RTOL)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, atol=ATOL, rtol=RTOL)


def test_bf16_keeps_no_fp32_scores_and_equals_the_old_path_to_bf16_rounding():
    attn = attention(-0.1, 1.05)
    tensors = qkv(torch.bfloat16)

    def saved_square_dtypes(fn):
        found = []

        def pack(t):
            if t.shape[-2:] == (T, T):
                found.append(t.dtype)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out_and_grads(fn, tensors)
        return found

    new = saved_square_dtypes(attn._explicit_attention)
    old = saved_square_dtypes(lambda q, k, v: reference_explicit_attention(attn, q, k, v))
    assert new and torch.float32 not in new
    assert torch.float32 in old
    out, grads = out_and_grads(attn._explicit_attention, tensors)
    ref, ref_grads = out_and_grads(lambda q, k, v: reference_explicit_attention(attn, q, k, v), tensors)
    assert out.dtype == ref.dtype == torch.bfloat16
    # the weights rounded to bf16 (2^-8 relative) a few times more (softmax output, the stretch, the clamp's input)
    # before the bf16 product both paths run, each weight's error times (zeta - gamma) and a value: a few units of
    # bf16 rounding at the output's scale
    scale = ref.float().abs().max().item()
    torch.testing.assert_close(out.float(), ref.float(), atol=2 ** -5 * scale, rtol=2 ** -5)
    for g, r in zip(grads, ref_grads, strict=True):
        scale = r.float().abs().max().item()
        torch.testing.assert_close(g.float(), r.float(), atol=2 ** -5 * scale, rtol=2 ** -5)


def test_the_softmax_names_its_dtype_so_cuda_autocast_keeps_it(monkeypatch):
    """CUDA's autocast runs a softmax called without ``dtype`` in fp32 (softmax is on its fp32 list; CPU's autocast
    leaves it alone), which would bring back fp32 (B, H, T, S) weights: a softmax that answers as CUDA's autocast
    does stands in for it here."""
    softmax = torch.softmax
    monkeypatch.setattr(torch, "softmax", lambda x, dim, dtype=None: softmax(x, dim, dtype=dtype or torch.float32))
    probs = attention(-0.1).probs
    scores = torch.randn(2, H, T, T).bfloat16()
    assert probs(scores).dtype == torch.bfloat16
    assert reference_clipped_softmax(probs, scores).dtype == torch.float32
