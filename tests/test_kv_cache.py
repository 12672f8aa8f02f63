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
