"""AttnRes's depth attention as one stacked op (issue 43) equals the per-source loop it replaced, and saves no copy.

The reference is the pre-rewrite ``DepthAttention.forward``, kept verbatim below; the new op must give the same
output and the same gradients (every parameter, every source, the stack's input) in float32, and stay within bf16's
rounding under autocast, for each key norm and for Full and Block AttnRes.
"""

from __future__ import annotations

import pytest
import torch

from arch_plugins.residuals.attnres import DepthAttention, DepthSoftmax
from lit.models import TransformerConfig
from lit.models.transformer import TransformerStack

KEY_NORMS = ("rmsnorm", "rmsnorm_nonparam", "none")
# float32: the new op sums in another order (one reduction over the stack, a hand-written backward) than the loop
# of addcmuls and autograd's chain did: a few float32 ulps, far below these.
FP32 = dict(atol=1e-6, rtol=1e-5)


def reference_depth_attention(self, sources: list[torch.Tensor]) -> torch.Tensor:
    """The pre-rewrite ``DepthAttention.forward`` (arch_plugins/residuals/attnres.py as of commit 20bd042, last
    changed in 9d0b527), verbatim."""
    dtype = torch.promote_types(sources[0].dtype, torch.float32)
    # Autocast off: it would run the matvecs in bf16; the depth softmax and the sum are float32 (flash-attn-res).
    with torch.autocast(device_type=sources[0].device.type, enabled=False):
        values = [s.to(dtype) for s in sources]
        query = (self.query if self.key_gain is None else self.query * self.key_gain).to(dtype)
        # One matvec and one norm per source, no stacked copy: w . RMSNorm(v) = (w * g) . v / rms(v).
        logits = torch.stack([v @ query for v in values])
        if self.normalise_keys:
            squares = torch.stack([torch.linalg.vector_norm(v, dim=-1).square() for v in values])
            logits = logits * torch.rsqrt(squares / values[0].shape[-1] + self.eps)
        weights = logits.softmax(0).unsqueeze(-1)
        out = values[0] * weights[0]
        for value, weight in zip(values[1:], weights[1:], strict=True):
            out = torch.addcmul(out, value, weight)
        return out


def moved_attention(dim: int, key_norm: str, seed: int = 0) -> DepthAttention:
    """A depth attention off its zero init (a zero query would weigh every source alike and hide the logits)."""
    torch.manual_seed(seed)
    attention = DepthAttention(dim, key_norm=key_norm, eps=1e-6)
    with torch.no_grad():
        attention.query.normal_()
        if attention.key_gain is not None:
            attention.key_gain.normal_(1.0, 0.5)
    return attention


def forward_and_gradients(attention: DepthAttention, sources: list[torch.Tensor], forward) -> list[torch.Tensor]:
    """The output, then the gradient of a random projection of it for the parameters and for every source."""
    sources = [s.detach().requires_grad_() for s in sources]
    out = forward(attention, sources)
    out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype))
    grads = [p.grad for p in attention.parameters()] + [s.grad for s in sources]
    attention.zero_grad()
    return [out.detach(), *grads]


@pytest.mark.parametrize("key_norm", KEY_NORMS)
@pytest.mark.parametrize("count,shape", [(1, (2, 5, 16)), (2, (2, 5, 16)), (5, (3, 7, 16)), (9, (1, 1, 8))],
                         ids=["one source", "two", "five", "nine, one token"])
def test_the_stacked_op_equals_the_per_source_loop(key_norm, count, shape):
    attention = moved_attention(shape[-1], key_norm)
    torch.manual_seed(2)
    sources = [torch.randn(shape) * scale for scale in torch.linspace(0.2, 5.0, count).tolist()]
    new = forward_and_gradients(attention, sources, DepthAttention.forward)
    old = forward_and_gradients(attention, sources, reference_depth_attention)
    assert len(new) == len(old) == len(list(attention.parameters())) + 1 + count
    for got, expected in zip(new, old, strict=True):
        torch.testing.assert_close(got, expected, **FP32)


@pytest.mark.parametrize("key_norm", KEY_NORMS)
def test_at_zero_query_the_stacked_op_is_the_average_with_the_same_gradients(key_norm):
    attention = DepthAttention(16, key_norm=key_norm, eps=1e-6)  # as initialised: w = 0, g = 1
    sources = [torch.randn(2, 5, 16) * s for s in (1.0, 3.0, 0.5)]
    new = forward_and_gradients(attention, sources, DepthAttention.forward)
    old = forward_and_gradients(attention, sources, reference_depth_attention)
    torch.testing.assert_close(new[0], torch.stack(sources).mean(0), rtol=0, atol=1e-6)
    for got, expected in zip(new, old, strict=True):
        torch.testing.assert_close(got, expected, **FP32)


@pytest.mark.parametrize("key_norm", KEY_NORMS)
def test_under_no_grad_the_same_forward_runs_without_the_autograd_function(key_norm, monkeypatch):
    """Eval passes skip DepthSoftmax (torch.compile 2.14 breaks the graph on its *sources under no_grad) and compute
    its forward directly: the output of a pass that builds the graph, bit for bit."""
    attention = moved_attention(16, key_norm)
    sources = [torch.randn(2, 5, 16) * s for s in (1.0, 3.0, 0.5)]
    with_graph = forward_and_gradients(attention, sources, DepthAttention.forward)[0]
    monkeypatch.setattr(DepthSoftmax, "apply", lambda *a: pytest.fail("the autograd.Function ran under no_grad"))
    with torch.no_grad():
        assert torch.equal(attention(sources), with_graph)


def test_mixed_source_dtypes_compute_in_float32_and_return_each_gradient_in_its_dtype():
    # As under bf16 autocast: the embedding float32, the sublayers' outputs bf16.
    attention = moved_attention(16, "rmsnorm")
    torch.manual_seed(3)
    sources = [torch.randn(2, 5, 16), *(torch.randn(2, 5, 16).bfloat16() for _ in range(3))]
    new = forward_and_gradients(attention, sources, DepthAttention.forward)
    old = forward_and_gradients(attention, sources, reference_depth_attention)
    assert new[0].dtype == torch.float32
    assert [g.dtype for g in new[3:]] == [torch.float32] + [torch.bfloat16] * 3
    for got, expected in zip(new[:4], old[:4], strict=True):  # output, query, gain, the float32 source
        torch.testing.assert_close(got, expected, **FP32)
    for got, expected in zip(new[4:], old[4:], strict=True):
        # The same float32 gradient rounded to bf16 (8 bits): a few float32 ulps apart may round one bf16 ulp
        # (2^-8 relative) apart.
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=2 ** -8)


def test_float64_sources_compute_in_float64():
    attention = moved_attention(8, "rmsnorm").double()
    sources = [torch.randn(2, 3, 8, dtype=torch.float64) for _ in range(4)]
    new = forward_and_gradients(attention, sources, DepthAttention.forward)
    old = forward_and_gradients(attention, sources, reference_depth_attention)
    for got, expected in zip(new, old, strict=True):
        assert got.dtype == torch.float64
        torch.testing.assert_close(got, expected, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("key_norm", KEY_NORMS)
def test_the_hand_written_backward_is_the_derivative(key_norm):
    """The backward against finite differences, in float64 (independent of the reference)."""
    torch.manual_seed(4)
    query = torch.randn(6, dtype=torch.float64, requires_grad=True)
    sources = [torch.randn(2, 3, 6, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    eps = None if key_norm == "none" else 1e-6
    assert torch.autograd.gradcheck(lambda q, *s: DepthSoftmax.apply(q, eps, *s), (query, *sources))


def test_the_op_compiles_whole_and_gives_the_eager_result():
    """The recipes compile on CUDA (issue 43): the op must trace into one graph, forward and backward."""
    attention = moved_attention(16, "rmsnorm")
    sources = [torch.randn(2, 5, 16), *(torch.randn(2, 5, 16).bfloat16() for _ in range(3))]
    compiled = torch.compile(attention, backend="aot_eager", fullgraph=True)

    def run(module):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return forward_and_gradients(attention, sources, lambda _, s: module(s))

    for got, expected in zip(run(compiled), run(attention), strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


def saved_for_backward(run) -> list[torch.Tensor]:
    saved = []

    def pack(tensor):
        saved.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        run()
    return saved


def test_no_float32_copy_of_the_sources_is_saved_for_backward():
    """What autograd keeps of one consumer: the bf16 sources themselves and per-token values, nothing source-sized
    that is not a source (the per-source loop kept a float32 copy of each bf16 source)."""
    attention = moved_attention(16, "rmsnorm")
    sources = [torch.randn(2, 5, 16, requires_grad=True),
               *(torch.randn(2, 5, 16).bfloat16().requires_grad_() for _ in range(4))]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        saved = saved_for_backward(lambda: attention(sources))
    source_storages = {s.untyped_storage().data_ptr() for s in sources}
    per_token = sources[0].shape[:-1].numel()  # (B, T): one value per token
    for tensor in saved:
        if tensor.untyped_storage().data_ptr() not in source_storages:
            assert tensor.numel() <= len(sources) * per_token or tensor.dim() == 1, (tensor.shape, tensor.dtype)
    assert source_storages <= {t.untyped_storage().data_ptr() for t in saved}


def attnres_stack(residual: str, options: dict, seed: int = 0, causal: bool = True) -> TransformerStack:
    torch.manual_seed(seed)
    cfg = TransformerConfig(d_model=16, n_layers=3, n_heads=2, residual=residual, residual_options=options)
    model = TransformerStack(cfg, causal=causal, max_len=8)
    with torch.no_grad():  # off the equal-weight average, so the logits and the key gains matter
        for name, parameter in model.named_parameters():
            if name.endswith("query"):
                parameter.normal_()
            elif name.endswith("key_gain"):
                parameter.normal_(1.0, 0.5)
    return model


def stack_forward_and_gradients(model: TransformerStack, x: torch.Tensor, autocast: bool) -> list[torch.Tensor]:
    x = x.detach().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = model(x)
    out.float().square().mean().backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None for g in grads)
    model.zero_grad()
    return [out.detach().float(), x.grad, *grads]


STACKS = [("attnres", {}), ("attnres", {"key_norm": "none"}), ("attnres_block", {"block_size": 2}),
          ("attnres_block", {"block_size": 3, "key_norm": "rmsnorm_nonparam"}), ("attnres_block", {})]


@pytest.mark.parametrize("residual,options", STACKS, ids=[f"{r}-{o}" for r, o in STACKS])
@pytest.mark.parametrize("causal", [True, False], ids=["lm", "encoder"])
def test_a_stack_equals_the_stack_before_the_rewrite(residual, options, causal, monkeypatch):
    model = attnres_stack(residual, options, causal=causal)
    x = torch.randn(2, 8, 16)
    new32 = stack_forward_and_gradients(model, x, autocast=False)
    new64 = stack_forward_and_gradients(model.double(), x.double(), autocast=False)
    monkeypatch.setattr(DepthAttention, "forward", reference_depth_attention)
    old64 = stack_forward_and_gradients(model, x.double(), autocast=False)
    old32 = stack_forward_and_gradients(model.float(), x, autocast=False)
    # float64: the same function of the weights and the input, to float64's rounding.
    for got, expected in zip(new64, old64, strict=True):
        torch.testing.assert_close(got, expected, atol=1e-12 * expected.abs().max().item(), rtol=1e-10)
    # float32: the two sum in different orders, and through three layers a few float32 ulps of the attention grow
    # as the stack conditions them: the smallest gradients (a nearly saturated pseudo-query's, 1e-5 in size) are
    # 3e-4 of their size off the float64 value in either version. So the test is that the rewrite is about as
    # accurate as the version before, tensor by tensor: its error against float64 within 8 times the old one's
    # (at most 2.6 times here; the errors are sums of many roundings) plus 1e-6 of the tensor's largest entry.
    # The float64 comparison above is the exact one; a wrong term misses both by orders of magnitude.
    for got, expected, exact in zip(new32, old32, old64, strict=True):
        scale = exact.abs().max().item()
        error_before = (expected.double() - exact).abs().max().item()
        error_now = (got.double() - exact).abs().max().item()
        assert error_now <= 8 * error_before + 1e-6 * scale, (error_now, error_before, scale)


@pytest.mark.parametrize("residual,options", STACKS[::2], ids=[f"{r}-{o}" for r, o in STACKS[::2]])
def test_a_stack_under_bf16_autocast_stays_within_bf16_rounding_of_the_stack_before(residual, options,
                                                                                      monkeypatch):
    model = attnres_stack(residual, options)
    x = torch.randn(2, 8, 16)
    new = stack_forward_and_gradients(model, x, autocast=True)
    monkeypatch.setattr(DepthAttention, "forward", reference_depth_attention)
    old = stack_forward_and_gradients(model, x, autocast=True)
    # Both read the same bf16 sources and attend in float32; a float32 difference of a few ulps can round a bf16
    # value (8 bits, 2^-8 = 0.4% relative) of a later sublayer's input one ulp apart, and the gradients go through
    # bf16 matrix products of 16 terms: a few bf16 ulps, relative to each tensor's scale.
    for got, expected in zip(new, old, strict=True):
        scale = expected.abs().max().item()
        torch.testing.assert_close(got, expected, atol=3 * 2 ** -8 * scale, rtol=2 ** -7)
