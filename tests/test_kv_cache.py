"""KV-cached decoding computes what the whole sequence does: for every registered norm strategy, residual type and
projection type (each built into the conformance kit's GPT, all weights perturbed off their identity inits so
LAUREL's, AttnRes' and hyper-connections' looking back is live), the stabilisers, learned and partial RoPE
positions, and nGPT as a pair. A component that cannot be cached says so by name and ``generate`` falls back."""

from __future__ import annotations

import warnings

import pytest
import torch

from arch_plugins import registry
from arch_plugins.testing.stacks import Size
from lit.models import conformance
from lit.models.gpt import GPT
from lit.models.transformer import TransformerConfig

SIZE = Size(n_layers=2)  # the kit's odd width and heads (48, 3), one layer fewer: history reads still span blocks
# Declared not cacheable (their ``incremental_decoding_conflict``): generate falls back for them.
NOT_CACHEABLE = {("norm", "3pt")}


def perturbed(model: GPT, seed: int = 0) -> GPT:
    """``model`` in eval mode with every parameter moved by noise: zero-initialised look-back paths (LAUREL's B,
    AttnRes' queries, hyper-connections' dynamic weights) would otherwise hide a position read the wrong way."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
    return model.eval()


def registered_gpt(kind: str, name: str) -> GPT:
    options = getattr(registry.load(kind, name), "stack_options", {}).get("gpt", {})
    torch.manual_seed(0)
    return perturbed(conformance.gpt({kind: (name, options)}, SIZE).model)


def cached_logits(model: GPT, idx: torch.Tensor, chunks=(3, 2)) -> torch.Tensor:
    """Logits at every position, fed through one KV cache: the first ``chunks`` (several new positions after
    cached ones, where the causal mask aligns bottom-right), then one token at a time as generate does."""
    cache, out, start = model.stack.new_cache(), [], 0
    sizes = [*chunks, *[1] * (idx.shape[1] - sum(chunks))]
    with torch.no_grad():
        for size in sizes:
            out.append(model(idx[:, start:start + size], cache=cache))
            start += size
    assert cache.length == idx.shape[1]
    return torch.cat(out, dim=1)


def assert_cache_matches(model: GPT, vocab: int, *, generate: bool = True):
    idx = torch.randint(0, vocab, (2, model.block_size), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(idx)
    assert (cached_logits(model, idx) - full).abs().max().item() < 1e-5
    if not generate:
        return
    # Greedy decoding past block_size: cached while the context fits, the sliding window after.
    prompt = idx[:, :4]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning for a cacheable model
        cached = model.generate(prompt, model.block_size + 3, temperature=0)
    assert torch.equal(cached, model.generate(prompt, model.block_size + 3, temperature=0, use_cache=False))


CASES = [(kind, name) for kind in ("norm", "residual", "projection") for name in registry.names(kind)
         if (kind, name) not in NOT_CACHEABLE]


@pytest.mark.parametrize("kind,name", CASES, ids=[f"{k}-{n}" for k, n in CASES])
def test_cached_decoding_equals_the_full_sequence(kind, name):
    model = registered_gpt(kind, name)
    assert model.kv_cache_conflict() is None
    assert_cache_matches(model, conformance.VOCAB, generate=kind == "residual")


STACKS = {
    "baseline": {},
    "ngpt": {"norm": "hypersphere", "residual": "ngpt"},
    "gpt2_learned_positions": {"norm": "layernorm", "positions": "learned", "mlp": "gelu_tanh", "bias": True},
    "partial_rope_qk_norm": {"rope_pct": 0.5, "qk_norm": "rmsnorm"},
    "clipped_softmax_gated_softcap": {"clipped_softmax_gamma": -0.03, "gated_attention": True, "logit_softcap": 3.0},
    "mup": {"parametrization": "mup", "parametrization_options": {"base_width": 16, "base_heads": 2}},
    "pattention_laurel_pa": {"projection": "pattention", "residual": "laurel_pa"},
}


@pytest.mark.parametrize("arch", STACKS.values(), ids=STACKS.keys())
def test_cached_decoding_equals_the_full_sequence_for_whole_stacks(arch):
    torch.manual_seed(0)
    model = perturbed(GPT(29, 10, TransformerConfig(d_model=32, n_heads=4, n_layers=2, **arch)))
    assert_cache_matches(model, 29)


def test_a_plugin_that_cannot_cache_falls_back_by_name():
    model = registered_gpt("norm", "3pt")
    prompt = torch.randint(0, conformance.VOCAB, (2, 5), generator=torch.Generator().manual_seed(2))
    with pytest.warns(UserWarning, match=r"without a KV cache: norm '3pt' .*horn"):
        fallen_back = model.generate(prompt, 4, temperature=0)
    assert torch.equal(fallen_back, model.generate(prompt, 4, temperature=0, use_cache=False))
    # The declaration is needed: forced through a cache, the horn puts every new token at position 0.
    idx = torch.randint(0, conformance.VOCAB, (2, model.block_size), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (cached_logits(model, idx) - model(idx)).abs().max().item() > 1e-3
    # Without the horn 3PT is cacheable again.
    torch.manual_seed(0)
    hornless = perturbed(conformance.gpt({"norm": ("3pt", {"horn": False})}, SIZE).model)
    assert hornless.kv_cache_conflict() is None
    assert_cache_matches(hornless, conformance.VOCAB, generate=False)


def test_training_mode_falls_back_with_its_reason():
    torch.manual_seed(0)
    model = GPT(29, 10, TransformerConfig(d_model=32, n_heads=4, n_layers=2)).train()
    with pytest.warns(UserWarning, match="training mode"):
        model.generate(torch.zeros(1, 3, dtype=torch.long), 2, temperature=0)


def test_generate_runs_one_new_token_per_step_while_the_context_fits():
    torch.manual_seed(0)
    model = GPT(29, 10, TransformerConfig(d_model=32, n_heads=4, n_layers=2)).eval()
    lengths = []
    model.stack.register_forward_pre_hook(lambda module, args: lengths.append(args[0].shape[1]))
    model.generate(torch.zeros(1, 4, dtype=torch.long), 9, temperature=0)
    # The prompt once, one token per step up to block_size (10), then the sliding window recomputed.
    assert lengths == [4, 1, 1, 1, 1, 1, 1, 10, 10]


def test_sampling_draws_the_same_tokens_with_and_without_the_cache():
    torch.manual_seed(0)
    model = perturbed(GPT(29, 16, TransformerConfig(d_model=32, n_heads=4, n_layers=2)))
    prompt = torch.randint(0, 29, (3, 4), generator=torch.Generator().manual_seed(3))
    drawn = [model.generate(prompt, 10, temperature=0.8, top_k=5, generator=torch.Generator().manual_seed(4),
                            use_cache=use_cache) for use_cache in (True, False)]
    assert torch.equal(*drawn)


# --- left-padded batches: prompts of different lengths decoded together ---------------------------------------

def padded(prompts: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The prompts left-padded into one batch (padding id 0) and each row's padding count."""
    width = max(len(p) for p in prompts)
    idx = torch.zeros(len(prompts), width, dtype=torch.long)
    for row, p in enumerate(prompts):
        idx[row, width - len(p):] = p
    return idx, torch.tensor([width - len(p) for p in prompts])


def assert_padded_batch_matches(model: GPT, vocab: int):
    """Each row of a left-padded batch gets the logits and the greedy tokens it gets decoded alone."""
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(1, vocab, (n,), generator=g) for n in (5, 2, 4)]
    idx, pad = padded(prompts)
    new = model.block_size - idx.shape[1]
    with torch.no_grad():
        cache = model.stack.new_cache(pad)
        batch_logits = model(idx, cache=cache)
        assert torch.isfinite(batch_logits).all()  # padding slots included: none is an all-masked NaN row
        step = torch.randint(1, vocab, (len(prompts), 1), generator=g)
        batch_next = model(step, cache=cache)[:, -1]
        batch_tokens = model.generate(idx, new, temperature=0, pad=pad)[:, idx.shape[1]:]
    for row, p in enumerate(prompts):
        with torch.no_grad():
            alone = model(torch.cat([p, step[row]])[None])
            tokens = model.generate(p[None], new, temperature=0)[0, len(p):]
        assert (batch_logits[row, pad[row]:] - alone[0, :-1]).abs().max().item() < 1e-5
        assert (batch_next[row] - alone[0, -1]).abs().max().item() < 1e-5
        assert torch.equal(batch_tokens[row], tokens)


@pytest.mark.parametrize("kind,name", CASES, ids=[f"{k}-{n}" for k, n in CASES])
def test_a_left_padded_batch_decodes_each_row_as_alone(kind, name):
    assert_padded_batch_matches(registered_gpt(kind, name), conformance.VOCAB)


@pytest.mark.parametrize("arch", STACKS.values(), ids=STACKS.keys())
def test_a_left_padded_batch_decodes_each_row_as_alone_for_whole_stacks(arch):
    torch.manual_seed(0)
    assert_padded_batch_matches(perturbed(GPT(29, 10, TransformerConfig(d_model=32, n_heads=4, n_layers=2, **arch))),
                                29)


def test_a_left_padded_batch_is_refused_where_it_cannot_be_exact():
    idx, pad = padded([torch.tensor([1, 2, 3]), torch.tensor([4])])
    with pytest.raises(ValueError, match=r"needs the KV cache; .*norm '3pt'"):
        registered_gpt("norm", "3pt").generate(idx, 2, temperature=0, pad=pad)
    torch.manual_seed(0)
    model = GPT(29, 10, TransformerConfig(d_model=32, n_heads=4, n_layers=2)).eval()
    with pytest.raises(ValueError, match=r"within block_size \(10\); 3 \+ 8"):
        model.generate(idx, 8, temperature=0, pad=pad)


def test_generate_stops_when_every_row_is_done():
    torch.manual_seed(0)
    model = GPT(29, 16, TransformerConfig(d_model=32, n_heads=4, n_layers=2)).eval()
    asked = []

    def stop(new):
        asked.append(new.shape[1])
        return new.shape[1] >= 6

    out = model.generate(torch.zeros(2, 3, dtype=torch.long), 12, temperature=0, stop=stop, stop_every=4)
    assert asked == [4, 8] and out.shape == (2, 3 + 8)
