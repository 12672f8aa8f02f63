"""Hyper-connections' and mHC's ``stream_dtype``: the n streams in autocast's dtype ("compute") or float32 (default)."""

from __future__ import annotations

import pytest
import torch

from arch_plugins import registry
from lit.models import TransformerConfig
from lit.models.transformer import TransformerStack

D, T = 16, 8
NAMES = ["hyperconn", "hyperconn_static", "mhc"]


def stack(name: str, stream_dtype: str) -> TransformerStack:
    torch.manual_seed(0)
    cfg = TransformerConfig(d_model=D, n_layers=2, n_heads=2, residual=name,
                            residual_options={"stream_dtype": stream_dtype})
    return TransformerStack(cfg, causal=True, max_len=T)


def run(model: TransformerStack, x: torch.Tensor, autocast: bool):
    """The output, the dtype of the streams between the blocks, and every parameter's gradient."""
    dtypes = []
    model.blocks[0].register_forward_hook(lambda _m, _a, out: dtypes.append(out.dtype))
    with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
        out = model(x)
    out.float().square().mean().backward()
    return out.float(), dtypes[0], {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("name", NAMES)
def test_without_autocast_compute_is_the_default(name):
    x = torch.randn(2, T, D)
    default, compute = run(stack(name, "float32"), x, False), run(stack(name, "compute"), x, False)
    assert default[1] == compute[1] == torch.float32
    assert torch.equal(default[0], compute[0])


@pytest.mark.parametrize("name", NAMES)
def test_under_autocast_the_streams_are_carried_in_bf16(name):
    x = torch.randn(2, T, D)
    fp32_streams, bf16_streams = run(stack(name, "float32"), x, True), run(stack(name, "compute"), x, True)
    assert fp32_streams[1] == torch.float32 and bf16_streams[1] == torch.bfloat16
    # The same model, the streams rounded to bf16 (8 significant bits) at every merge: within a few bf16 ulps.
    torch.testing.assert_close(bf16_streams[0], fp32_streams[0], rtol=5e-2, atol=5e-2)
    for n, g in bf16_streams[2].items():
        assert g is not None and torch.isfinite(g).all(), n
    merge_grads = [g for n, g in bf16_streams[2].items() if "merge" in n]
    assert merge_grads and any(g.abs().sum() > 0 for g in merge_grads)


def test_a_bad_stream_dtype_says_what_to_do():
    with pytest.raises(registry.PluginError, match="give one of float32, compute") as info:
        registry.create("residual", "mhc", {"stream_dtype": "bf16"})
    assert "\n" not in str(info.value)
