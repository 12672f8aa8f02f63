"""Attention Residuals: the paper's equations on hand-made tensors, the equal-weight average at init, blocks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from arch_plugins import registry
from arch_plugins.constraints import unit_norm_parameters
from arch_plugins.residuals.attnres import DepthAttention
from lit.models import TransformerConfig
from lit.models.transformer import TransformerStack

D, LAYERS, T = 16, 3, 8


def stack(causal: bool = True, seed: int = 0, **kw) -> TransformerStack:
    torch.manual_seed(seed)
    cfg = TransformerConfig(**{"d_model": D, "n_layers": LAYERS, "n_heads": 2, **kw})
    return TransformerStack(cfg, causal=causal, max_len=T)


def run_and_record(model: TransformerStack, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor], object]:
    """The stack's output, what every sublayer read (the input of its ``*_in`` site), and the residual history."""
    inputs, captured = [], {}

    def read_history(module, args):
        captured["history"] = args[1]

    def read_input(module, args):
        inputs.append(args[0])

    handles = [model.blocks[0].register_forward_pre_hook(read_history)]
    for block in model.blocks:
        for site in (block.attn_in, block.mlp_in):
            handles.append(site.register_forward_pre_hook(read_input))
    out = model(x)
    for handle in handles:
        handle.remove()
    return out, inputs, captured["history"]


def paper_sources(embedding: torch.Tensor, outputs: list[torch.Tensor], consumer: int, block_size: int):
    """The paper's value list for sublayer ``consumer``: b_0 = embedding, completed block sums b_n, and the current
    block's partial sum when it has a term (Full AttnRes: block size 1, every earlier output on its own)."""
    blocks = [embedding]
    for start in range(0, consumer, block_size):
        blocks.append(sum(outputs[start:min(start + block_size, consumer)]))
    return blocks


@pytest.mark.parametrize("causal", [True, False], ids=["lm", "encoder"])
@pytest.mark.parametrize("name,options,block_size", [
    ("attnres", {}, 1), ("attnres_block", {"block_size": 2}, 2), ("attnres_block", {"block_size": 4}, 4),
    ("attnres_block", {"block_size": 3}, 3)])
def test_at_init_every_sublayer_reads_the_equal_weight_average(name, options, block_size, causal):
    model = stack(causal, residual=name, residual_options=options)
    x = torch.randn(2, T, D)
    out, inputs, history = run_and_record(model, x)
    embedding, outputs = history.states[0], history.branches  # v_0 and every sublayer's output f_i(h_i)
    assert len(inputs) == 2 * LAYERS
    torch.testing.assert_close(inputs[0], embedding, rtol=0, atol=0)
    for consumer in range(1, 2 * LAYERS):
        sources = paper_sources(embedding, outputs, consumer, block_size)
        torch.testing.assert_close(inputs[consumer], torch.stack(sources).mean(0), rtol=0, atol=1e-6,
                                   msg=f"sublayer {consumer}")
    # The output before the final norm: the average over every block, the last one included.
    final = torch.stack(paper_sources(embedding, outputs, 2 * LAYERS, block_size)).mean(0)
    torch.testing.assert_close(out, model.final(final), rtol=0, atol=1e-5)


def readme_pseudocode(values: torch.Tensor, query: torch.Tensor, gain: torch.Tensor | None, eps: float):
    """The official README's block_attn_res: K = norm(V); logits = einsum('d,nbtd->nbt'); softmax over dim 0."""
    keys = F.rms_norm(values, (values.shape[-1],), gain, eps)
    logits = torch.einsum("d, n b t d -> n b t", query, keys)
    return torch.einsum("n b t, n b t d -> b t d", logits.softmax(0), values)


@pytest.mark.parametrize("key_norm", ["rmsnorm", "rmsnorm_nonparam"])
def test_depth_attention_is_the_readme_pseudocode(key_norm):
    torch.manual_seed(0)
    attention = DepthAttention(D, key_norm=key_norm, eps=1e-6)
    with torch.no_grad():
        attention.query.normal_()
        if attention.key_gain is not None:
            attention.key_gain.normal_(1.0, 0.5)
    sources = [torch.randn(2, 5, D) * scale for scale in (1.0, 3.0, 0.2, 7.0)]
    expected = readme_pseudocode(torch.stack(sources), attention.query, attention.key_gain, 1e-6)
    torch.testing.assert_close(attention(sources), expected, rtol=1e-5, atol=1e-5)


def test_depth_attention_by_hand():
    # d = 2, two sources; w = (1, 0), no gain. RMSNorm(v) = v / sqrt(mean(v^2)):
    # v_0 = (3, 4): rms = sqrt(12.5), key_0 . w = 3 / sqrt(12.5); v_1 = (0, 2): rms = sqrt(2), key_1 . w = 0.
    attention = DepthAttention(2, key_norm="rmsnorm_nonparam", eps=0.0)
    with torch.no_grad():
        attention.query.copy_(torch.tensor([1.0, 0.0]))
    v0, v1 = torch.tensor([3.0, 4.0]), torch.tensor([0.0, 2.0])
    a0 = torch.tensor(3 / 12.5 ** 0.5).exp() / (torch.tensor(3 / 12.5 ** 0.5).exp() + 1)
    torch.testing.assert_close(attention([v0, v1]), a0 * v0 + (1 - a0) * v1)
    # Without the key norm the raw dot product decides: logits (3, 0).
    raw = DepthAttention(2, key_norm="none", eps=0.0)
    raw.load_state_dict(attention.state_dict())
    a0 = torch.tensor(3.0).exp() / (torch.tensor(3.0).exp() + 1)
    torch.testing.assert_close(raw([v0, v1]), a0 * v0 + (1 - a0) * v1)


def test_the_block_size_default_is_about_eight_blocks_of_whole_layers():
    residual = registry.create("residual", "attnres_block")
    sizes = {layers: residual.sublayers_per_block(stack_info(layers)) for layers in (4, 8, 12, 27)}
    assert sizes == {4: 2, 8: 2, 12: 4, 27: 8}  # 4, 8, 6 and 7 blocks (plus the embedding)
    assert registry.create("residual", "attnres").sublayers_per_block(stack_info(27)) == 1


def stack_info(layers: int):
    from arch_plugins.interfaces import StackInfo

    return StackInfo(D, layers, 2, 4 * D, causal=True)


@pytest.mark.parametrize("name", ["attnres", "attnres_block"])
def test_every_pseudo_query_learns(name):
    model = stack(residual=name)
    model(torch.randn(2, T, D)).square().mean().backward()
    queries = {n: p.grad for n, p in model.named_parameters() if n.endswith("query")}
    # One per sublayer but the first (a single source needs none), plus the final aggregation's.
    assert len(queries) == 2 * LAYERS
    assert all(g is not None and g.abs().sum() > 0 for g in queries.values()), queries.keys()
    # The key gains get a gradient once their query moved off zero (w . (g * k)): at init, exactly none.
    gains = [p.grad for n, p in model.named_parameters() if n.endswith("key_gain")]
    assert gains and all(g is not None and not g.any() for g in gains)


def test_moving_the_queries_moves_off_the_average():
    model = stack(residual="attnres")
    x = torch.randn(2, T, D)
    before = model(x)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("query"):
                p.normal_()
    assert not torch.allclose(model(x), before, atol=1e-3)


def test_composes_with_the_hypersphere_norm_strategy():
    """nGPT's strategy normalises every branch and every partial sum; the sublayers then read an average of
    unit vectors (not itself unit: it is the paper's average, and nGPT has no input norm to undo it)."""
    model = stack(residual="attnres", norm="hypersphere")
    assert unit_norm_parameters(model)  # the strategy still constrains the weights
    x = torch.randn(2, T, D)
    out, inputs, history = run_and_record(model, x)
    unit = history.branches  # the attn_out / mlp_out sites already L2-normalise them
    torch.testing.assert_close(torch.linalg.vector_norm(unit[0], dim=-1), torch.ones(2, T))
    for consumer in range(1, 2 * LAYERS):
        expected = torch.stack([history.states[0], *unit[:consumer]]).mean(0)
        torch.testing.assert_close(inputs[consumer], expected, rtol=0, atol=1e-6)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("options,message", [
    ({"block_size": 0}, "give an integer >= 1"),
    ({"key_norm": "layernorm"}, "key_norm must be one of"),
    ({"eps": -1.0}, "eps must be positive"),
])
def test_bad_options_say_what_to_do(options, message):
    with pytest.raises(registry.PluginError, match=message) as info:
        registry.create("residual", "attnres_block", options)
    assert "\n" not in str(info.value)
