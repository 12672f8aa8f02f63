"""The training loss read out in chunks (lit/readout_loss.py): the loss and gradients of the whole-logits loss,
whatever the head applies to its logits, without the whole (tokens x vocab) logits.

Tolerance: fp32 sums in another order, so the loss within 1e-6 relative and every gradient within 1e-5
(relative and absolute); a micro-batch that fits one chunk is bit-identical.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from arch_plugins.stabilisers.z_loss import z_loss
from lit.errors import UserInputError
from lit.language_model import LanguageModel
from lit.models import GPT, TransformerConfig
from lit.readout_loss import chunk_tokens, readout_loss

VOCAB, T = 37, 12
# Every kind of logits transform a head applies: none, nGPT's s_z (a learned scale per vocabulary entry, and the
# unit-norm head), a soft-cap, muP's readout multiplier, a tied head.
ARCHS = {
    "baseline": dict(),
    "ngpt": dict(norm="hypersphere", residual="ngpt"),
    "softcap": dict(logit_softcap=3.0),
    "mup": dict(parametrization="mup"),
}


def gpt(arch: dict, tied: bool = False) -> GPT:
    torch.manual_seed(0)
    model = GPT(VOCAB, T, TransformerConfig(d_model=16, n_layers=1, n_heads=2, **arch), tie_embeddings=tied)
    with torch.no_grad():  # off the init (s_z and muP's zero head start at values that hide a wrong transform)
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def whole(model: GPT, idx, targets):
    logits = model(idx)
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten()), z_loss(logits)


def chunked(model: GPT, idx, targets, chunk):
    return readout_loss(model.readout, model(idx, readout=False), targets, chunk, with_z=True)


def loss_and_grads(model: GPT, loss_fn, *args):
    model.zero_grad()
    ce, z = loss_fn(model, *args)
    (ce + 1e-2 * z).backward()
    return ce.detach(), z.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def batch(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, VOCAB, (3, T), generator=g)
    return idx, torch.randint(0, VOCAB, (3, T), generator=g)


@pytest.mark.parametrize("name", [*ARCHS, "tied"])
def test_chunked_loss_equals_the_whole_logits_loss(name):
    model = gpt(ARCHS.get(name, {}), tied=name == "tied")
    idx, targets = batch()
    ce, z, grads = loss_and_grads(model, whole, idx, targets)
    for chunk in (5, 17):  # uneven chunks: the last one shorter
        got_ce, got_z, got_grads = loss_and_grads(model, chunked, idx, targets, chunk)
        torch.testing.assert_close(got_ce, ce, rtol=1e-6, atol=0)
        torch.testing.assert_close(got_z, z, rtol=1e-6, atol=0)
        for n, g in grads.items():
            torch.testing.assert_close(got_grads[n], g, rtol=1e-5, atol=1e-5, msg=n)


def test_one_chunk_is_the_whole_logits_path_bit_for_bit():
    model = gpt(ARCHS["softcap"])
    idx, targets = batch()
    ce, z, grads = loss_and_grads(model, whole, idx, targets)
    got_ce, got_z, got_grads = loss_and_grads(model, chunked, idx, targets, idx.numel())
    assert torch.equal(got_ce, ce) and torch.equal(got_z, z)
    assert all(torch.equal(got_grads[n], g) for n, g in grads.items())


def test_ignored_targets_count_as_in_cross_entropy():
    model = gpt({})
    idx, targets = batch()
    targets[0, :7] = -100
    torch.testing.assert_close(chunked(model, idx, targets, 5)[0], whole(model, idx, targets)[0], rtol=1e-6, atol=0)


def test_no_saved_tensor_holds_the_whole_logits():
    """What autograd keeps for backward: logits-shaped tensors (last dim the vocabulary) of every token when whole,
    none at all with chunks (each chunk's logits are recomputed in backward)."""
    model = gpt({})
    idx, targets = batch()
    tokens = idx.numel()

    def largest_saved(loss_fn, *args):
        sizes = [0]

        def pack(t):
            sizes.append(t.numel() if t.shape[-1:] == (VOCAB,) else 0)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss_fn(model, *args)
        return max(sizes)

    assert largest_saved(whole, idx, targets) == tokens * VOCAB
    assert largest_saved(chunked, idx, targets, 5) == 0


def test_chunk_size_follows_the_budget_and_training_uses_it():
    assert chunk_tokens(50304, 256) == 1334 and chunk_tokens(65, 256) > 1_000_000 and chunk_tokens(10, 0) is None
    assert chunk_tokens(10 ** 9, 1) == 1
    with pytest.raises(UserInputError, match="loss_chunk_mib"):
        LanguageModel(vocab_size=VOCAB, block_size=T, loss_chunk_mib=-1)
    # LanguageModel.training_step goes through the chunks: at a budget of 5 tokens it equals the whole loss.
    torch.manual_seed(0)
    cfg = TransformerConfig(d_model=16, n_layers=1, n_heads=2)
    module = LanguageModel(vocab_size=VOCAB, block_size=T, arch=cfg, loss_chunk_mib=5 * 4 * VOCAB / 2 ** 20)
    module.log_training_step = lambda loss, items: None
    calls = []
    module.model.head.register_forward_hook(lambda m, i, o: calls.append(o.shape[0]))
    idx, targets = batch()
    loss = module.training_step((idx, targets), 0)
    assert calls == [5] * 7 + [1]
    torch.testing.assert_close(loss, module._loss(module(idx), targets), rtol=1e-6, atol=0)
