"""Issue 43's rewrites of hyper-connections and mHC for speed compute what the code before them computed.

The first rewrite normalises, projects and mixes once per sublayer (the old code did each twice: once for the branch
input, once for the merge), and runs mHC's Sinkhorn as one autograd node that recomputes its iterations in the
backward. The pre-rewrite merges are kept below, verbatim in their arithmetic, as ``Reference...``. The second runs
each merge's coefficients and mix as one autograd node with a hand-written backward (autograd through the small
coefficient ops dispatched about three ops per forward op); the merges it replaced, from commit c7f3728, are kept
as ``Current...``. Each test puts the same weights in both and compares the forward outputs and the gradients of
every parameter, of the streams and of the branch, in float32.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from arch_plugins import registry
from arch_plugins.interfaces import ResidualHistory, StackInfo
from arch_plugins.residuals.manifold_hyper_connections import sinkhorn_knopp
from lit.models import TransformerConfig
from lit.models.transformer import TransformerStack

D = 16
INFO = StackInfo(D, 3, 2, 4 * D, causal=True)
# Tolerances: the new code computes the same expressions, but from one matmul over all the coefficient columns where
# the old code ran two over subsets, and with Sinkhorn's gradient written out; float32 rounding differs, no more.
# The absolute part scales with the tensor: a gradient entry summed over tokens can cancel to far below the terms
# it sums, and keeps their rounding (a few float32 ulps of the largest entry).
ATOL, RTOL = 1e-6, 1e-5


# A whole stack is compared in float64: with merges far from init, 6 of them, attention, MLPs and norms amplify
# float32's rounding differences to ~1e-3 of some gradients (a scalar gate's gradient sums cancelling terms over every
# token), while in float64 both agree to ~1e-12: the same math. 1e-9 leaves room and still fails on any real change.
# mHC computes its coefficients in float32 whatever the streams' dtype (its design), so its stacks agree to that
# precision there: 1e-7 of the largest entry (seen: 7e-9).
STACK_ATOL, STACK_RTOL = {"hyperconn": 1e-9, "hyperconn_static": 1e-9, "mhc": 1e-7}, 1e-9


def assert_close(got: torch.Tensor, expected: torch.Tensor, name: str = "", atol: float = ATOL,
                 rtol: float = RTOL) -> None:
    atol = atol * max(1.0, expected.abs().max().item())
    torch.testing.assert_close(got, expected, atol=atol, rtol=rtol, msg=lambda m: f"{name}: {m}")


# --- the pre-rewrite merges, from commit 20bd042 (arch_plugins/residuals/hyper_connections.py and
# manifold_hyper_connections.py), parameters copied from a new merge --------------------------------------------


def reference_mix(alpha: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    with torch.autocast(device_type=h.device.type, enabled=False):
        alpha = alpha.to(h.dtype)
        return torch.einsum("sk,...sd->...kd" if alpha.dim() == 2 else "...sk,...sd->...kd", alpha, h)


class ReferenceStreamMixing(nn.Module):
    def __init__(self, new: nn.Module):
        super().__init__()
        for name, p in new.named_parameters():
            setattr(self, name, nn.Parameter(p.detach().clone()))

    def branch_input(self, h, history):
        return reference_mix(self.branch_weights(h), h).squeeze(-2)

    def forward(self, h, branch, history):
        alpha, beta = self.depth_weights(h)
        return torch.addcmul(reference_mix(alpha, h), beta.to(h.dtype).unsqueeze(-1),
                             branch.to(h.dtype).unsqueeze(-2))


class ReferenceHyperConnection(ReferenceStreamMixing):
    def __init__(self, new):
        super().__init__(new)
        self.streams, self.dynamic, self.tanh = new.streams, new.dynamic, new.tanh

    def _dynamic(self, h, weight):
        inverse = math.sqrt(h.shape[-1]) / torch.linalg.vector_norm(h, dim=-1, keepdim=True).clamp_min(1e-12)
        out = (h @ (self.norm_gain.unsqueeze(-1) * weight).to(h.dtype)) * inverse
        return out.tanh() if self.tanh else out

    def branch_weights(self, h):
        static = self.static_alpha[:, :1]
        if not self.dynamic:
            return static
        return static + self._dynamic(h, self.dynamic_alpha[:, :1]) * self.dynamic_alpha_scale

    def depth_weights(self, h):
        alpha, beta = self.static_alpha[:, 1:], self.static_beta
        if not self.dynamic:
            return alpha, beta
        dynamic = self._dynamic(h, torch.cat([self.dynamic_alpha[:, 1:], self.dynamic_beta.unsqueeze(-1)], dim=-1))
        return alpha + dynamic[..., :-1] * self.dynamic_alpha_scale, beta + dynamic[..., -1] * self.dynamic_beta_scale


def reference_sinkhorn_knopp(logits, iters, eps=1e-6):
    m = torch.exp(logits - logits.amax(dim=-1, keepdim=True))
    for _ in range(iters):
        m = m / m.sum(dim=-1, keepdim=True).clamp_min(eps)
        m = m / m.sum(dim=-2, keepdim=True).clamp_min(eps)
    return m


class ReferenceManifoldConstrainedConnection(ReferenceStreamMixing):
    def __init__(self, new):
        super().__init__(new)
        self.streams, self.sinkhorn_iters, self.norm_eps = new.streams, new.sinkhorn_iters, new.norm_eps

    def _logits(self, h, rows):
        flat = h.float().flatten(-2)
        inverse_rms = 1.0 / (flat.norm(dim=-1, keepdim=True) / flat.shape[-1] ** 0.5 + self.norm_eps)
        return (flat @ self.phi[rows].float().t()) * inverse_rms

    def branch_weights(self, h):
        n = self.streams
        with torch.autocast(device_type=h.device.type, enabled=False):
            pre_act = self._logits(h, slice(0, n)) * self.alpha_pre.float() + self.bias[:n].float()
            return torch.sigmoid(pre_act).unsqueeze(-1)

    def depth_weights(self, h):
        n = self.streams
        with torch.autocast(device_type=h.device.type, enabled=False):
            logits = self._logits(h, slice(n, None))
            post = 2 * torch.sigmoid(logits[..., :n] * self.alpha_post.float() + self.bias[n:2 * n].float())
            res_logits = logits[..., n:] * self.alpha_res.float() + self.bias[2 * n:].float()
            res = reference_sinkhorn_knopp(res_logits.unflatten(-1, (n, n)), self.sinkhorn_iters)
        return res.transpose(-1, -2), post


REFERENCES = {"hyperconn": ReferenceHyperConnection, "hyperconn_static": ReferenceHyperConnection,
              "mhc": ReferenceManifoldConstrainedConnection}


# --- the merges before the hand-written backward, from commit c7f3728 (the same files), parameters copied from a
# new merge -----------------------------------------------------------------------------------------------------


def current_mix(mixing: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    with torch.autocast(device_type=h.device.type, enabled=False):
        mixing = mixing.to(h.dtype)
        if mixing.dim() == 2:
            mixing = mixing.expand(*h.shape[:-2], *mixing.shape)
        return torch.matmul(mixing, h)


class CurrentStreamMixing(ReferenceStreamMixing):
    _pending = None

    def _mixed(self, h):
        mixing, beta = self.mixing_weights(h)
        return current_mix(mixing, h), beta

    def branch_input(self, h, history):
        mixed, beta = self._mixed(h)
        self._pending = (h, mixed, beta)
        return mixed[..., 0, :].contiguous()

    def forward(self, h, branch, history):
        pending, self._pending = self._pending, None
        if pending is not None and pending[0] is h:
            _, mixed, beta = pending
        else:
            mixed, beta = self._mixed(h)
        return torch.addcmul(mixed[..., 1:, :], beta.to(h.dtype).unsqueeze(-1), branch.to(h.dtype).unsqueeze(-2))


class CurrentHyperConnection(CurrentStreamMixing):
    def __init__(self, new):
        super().__init__(new)
        self.streams, self.dynamic, self.tanh = new.streams, new.dynamic, new.tanh

    def _dynamic(self, h, weight):
        inverse = math.sqrt(h.shape[-1]) / torch.linalg.vector_norm(h, dim=-1, keepdim=True).clamp_min(1e-12)
        out = (h @ (self.norm_gain.unsqueeze(-1) * weight).to(h.dtype)) * inverse
        return out.tanh() if self.tanh else out

    def mixing_weights(self, h):
        alpha, beta = self.static_alpha, self.static_beta
        if self.dynamic:
            dynamic = self._dynamic(h, torch.cat([self.dynamic_alpha, self.dynamic_beta.unsqueeze(-1)], dim=-1))
            alpha = alpha + dynamic[..., :-1] * self.dynamic_alpha_scale
            beta = beta + dynamic[..., -1] * self.dynamic_beta_scale
        return alpha.transpose(-1, -2), beta


class CurrentManifoldConstrainedConnection(CurrentStreamMixing):
    def __init__(self, new):
        super().__init__(new)
        self.streams, self.sinkhorn_iters, self.norm_eps = new.streams, new.sinkhorn_iters, new.norm_eps

    def coefficients(self, h):
        n = self.streams
        with torch.autocast(device_type=h.device.type, enabled=False):
            flat = h.float().flatten(-2)
            inverse_rms = 1.0 / (flat.norm(dim=-1, keepdim=True) / flat.shape[-1] ** 0.5 + self.norm_eps)
            gates = torch.cat([self.alpha_pre.expand(n), self.alpha_post.expand(n), self.alpha_res.expand(n * n)])
            h_tilde = (flat @ self.phi.float().t()) * inverse_rms * gates.float() + self.bias.float()
            pre = torch.sigmoid(h_tilde[..., :n])
            post = 2 * torch.sigmoid(h_tilde[..., n:2 * n])
            res = sinkhorn_knopp(h_tilde[..., 2 * n:].unflatten(-1, (n, n)), self.sinkhorn_iters)
        return pre, post, res

    def mixing_weights(self, h):
        pre, post, res = self.coefficients(h)
        return torch.cat([pre.unsqueeze(-2), res], dim=-2), post


CURRENT = {"hyperconn": CurrentHyperConnection, "hyperconn_static": CurrentHyperConnection,
           "mhc": CurrentManifoldConstrainedConnection}


# --- the comparisons ----------------------------------------------------------------------------------------------


def shaken_merge(name: str, options: dict, seed: int) -> nn.Module:
    """A new merge with every parameter moved off its init (the dynamic parts and gates far from zero), so each
    coefficient depends on the streams and each gradient is non-zero."""
    torch.manual_seed(seed)
    merge = registry.create("residual", name, options).merge("mlp", 1, INFO)
    with torch.no_grad():
        for p in merge.parameters():
            p.add_(0.5 * torch.randn_like(p))
    return merge


def run_sublayer(merge: nn.Module, h: torch.Tensor, f: nn.Module, *, merge_alone: bool = False,
                 autocast: bool = False):
    """One sublayer as the block runs it (branch input, f, merge; under bf16 autocast if asked), then a backward
    from a fixed random direction: (branch input, new streams, gradients by name: every parameter of the merge and
    of f, the streams)."""
    h = h.detach().clone().requires_grad_()
    history = ResidualHistory(recording=False)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16, enabled=autocast):
        x = merge.branch_input(h, history)
        out = merge(h, f(x) if not merge_alone else f(x.detach()), history)
    torch.manual_seed(123)
    # Fixed directions by shape (randn_like would follow a strided view's memory order: other values per element).
    ((out.float() * torch.randn(out.shape)).sum() + (x.float() * torch.randn(x.shape)).sum()).backward()
    grads = {f"merge.{n}": p.grad for n, p in merge.named_parameters()}
    grads |= {f"f.{n}": p.grad for n, p in f.named_parameters()}
    return x.detach(), out.detach(), grads | {"streams": h.grad}


def assert_same_sublayer(new: nn.Module, h: torch.Tensor, before: dict = REFERENCES, *, exact_forward: bool = False,
                         f: nn.Module | None = None, streams_atol: float = ATOL, **kw):
    """``new`` against the merge ``before`` it (the same weights): the forward to float32 rounding (``exact_forward``:
    bit for bit), every gradient to float32 rounding, the streams' to ``streams_atol`` of its largest entry."""
    reference = before[new_name(new)](new)
    torch.manual_seed(7)
    f = f or nn.Sequential(nn.Linear(D, D), nn.Tanh())
    f_reference = copy.deepcopy(f)
    got, expected = run_sublayer(new, h, f, **kw), run_sublayer(reference, h, f_reference, **kw)
    if exact_forward:
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    assert_close(got[0], expected[0], "branch input")
    assert_close(got[1], expected[1], "streams out")
    assert got[2].keys() == expected[2].keys()
    for name in expected[2]:
        assert expected[2][name] is not None and expected[2][name].abs().sum() > 0, name  # not vacuous
        assert got[2][name].dtype == expected[2][name].dtype, name
        assert_close(got[2][name], expected[2][name], name, atol=streams_atol if name == "streams" else ATOL)


def new_name(merge: nn.Module) -> str:
    if hasattr(merge, "phi"):
        return "mhc"
    return "hyperconn" if merge.dynamic else "hyperconn_static"


CASES = [
    ("hyperconn", {"streams": 4}),
    ("hyperconn", {"streams": 3, "tanh": False}),
    ("hyperconn", {"streams": 1}),
    ("hyperconn", {"streams": 2, "dynamic_scale": 0.3}),
    ("hyperconn_static", {"streams": 4}),
    ("hyperconn_static", {"streams": 1}),
    ("mhc", {"streams": 4}),
    ("mhc", {"streams": 2, "sinkhorn_iters": 1}),
    ("mhc", {"streams": 3, "gating_init": 0.0, "norm_eps": 1e-3}),
]
SHAPES = [(2, 5), (1, 1), (3, 7)]  # (batch, tokens): the streams are (batch, tokens, n, d)


@pytest.mark.parametrize("shape", SHAPES, ids=[f"{b}x{t}" for b, t in SHAPES])
@pytest.mark.parametrize(("name", "options"), CASES, ids=[f"{n}-{o}" for n, o in CASES])
def test_a_sublayer_equals_the_pre_rewrite_merge(name, options, shape):
    merge = shaken_merge(name, options, seed=len(str(options)))
    h = 2.0 * torch.randn(*shape, merge.streams, D)
    assert_same_sublayer(merge, h)


@pytest.mark.parametrize("shape", SHAPES, ids=[f"{b}x{t}" for b, t in SHAPES])
@pytest.mark.parametrize(("name", "options"), CASES, ids=[f"{n}-{o}" for n, o in CASES])
def test_a_sublayer_equals_the_merge_before_its_hand_written_backward(name, options, shape):
    # The forward runs the ops of c7f3728's merge in its order, so it is the same bit for bit (mHC's Sinkhorn turns
    # one ulp in a logit into ~1e-5 of the gates' gradients, cancelling sums over tokens); the backward is autograd's
    # for those ops, written out: the same to float32 rounding.
    merge = shaken_merge(name, options, seed=len(str(options)))
    h = 2.0 * torch.randn(*shape, merge.streams, D)
    assert_same_sublayer(merge, h, CURRENT, exact_forward=True)


class ToFloat32(nn.Module):
    def forward(self, x):
        return x.float()


@pytest.mark.parametrize("branch", ["autocast", "float32"])
@pytest.mark.parametrize("stream_dtype", ["float32", "compute"])
@pytest.mark.parametrize("name", ["hyperconn", "hyperconn_static", "mhc"])
def test_under_autocast_a_sublayer_equals_the_merge_before_its_hand_written_backward(name, stream_dtype, branch):
    # bf16 autocast as a GPU run has it: hyper-connections' coefficient matmul in bf16 (inputs cast, its backward's
    # GEMMs in bf16), a bf16 branch from the sublayer (or a float32 one, as a sublayer ending in a float32 op
    # returns), float32 or bf16 streams. The forward is the same bit for bit and every parameter's gradient to
    # float32 rounding. The streams' gradient sums its terms (the mix, the coefficients, the norm) before one
    # rounding to the streams' dtype where autograd rounds each: bf16 streams agree to a bf16 step of the largest
    # entry (2^-7 of it), float32 ones to float32 rounding.
    merge = shaken_merge(name, {"stream_dtype": stream_dtype}, seed=1)
    h = 2.0 * torch.randn(3, 7, merge.streams, D)
    h = h.bfloat16() if stream_dtype == "compute" else h
    torch.manual_seed(7)
    f = nn.Sequential(nn.Linear(D, D), ToFloat32()) if branch == "float32" else nn.Linear(D, D)
    assert_same_sublayer(merge, h, CURRENT, exact_forward=True, f=f, autocast=True,
                         streams_atol=2 ** -7 if stream_dtype == "compute" else ATOL)


@pytest.mark.parametrize("name", ["hyperconn", "mhc"])
def test_a_merge_called_on_its_own_computes_its_coefficients_again(name):
    # The coefficients branch_input computed are kept for the merge of the same streams only: a merge on other
    # streams (or without a branch_input before it) must not mix with stale ones.
    merge = shaken_merge(name, {"streams": 3}, seed=1)
    reference = REFERENCES[name](merge)
    h, other, y = torch.randn(2, 5, 3, D), torch.randn(2, 5, 3, D), torch.randn(2, 5, D)
    history = ResidualHistory(recording=False)
    merge.branch_input(h, history)
    assert_close(merge(other, y, history), reference(other, y, history))
    assert_close(merge(h, y, history), reference(h, y, history))
    assert merge._pending is None  # the merge forgets them: no streams are held past the sublayer
    merge.branch_input(h, history)
    copy.deepcopy(merge)  # a merge caught between the two calls still copies (the kept tensors are not copied)


def twin_stacks(name: str, options: dict, before: dict) -> tuple[TransformerStack, TransformerStack]:
    """A 3-layer stack with shaken merges, and the same stack with every merge replaced by its merge ``before``."""
    torch.manual_seed(0)
    cfg = TransformerConfig(d_model=D, n_layers=3, n_heads=2, residual=name, residual_options=options)
    new = TransformerStack(cfg, causal=True, max_len=8)
    with torch.no_grad():
        for n, p in new.named_parameters():
            if "merge" in n:
                p.add_(0.3 * torch.randn_like(p))
    old = copy.deepcopy(new)
    for block in old.blocks:
        block.attn_merge = before[name](block.attn_merge)
        block.mlp_merge = before[name](block.mlp_merge)
    return new, old


@pytest.mark.parametrize("before", ["pre-rewrite", "c7f3728"])
@pytest.mark.parametrize(("name", "options"), [("hyperconn", {}), ("hyperconn_static", {}), ("mhc", {}),
                                               ("mhc", {"streams": 2, "sinkhorn_iters": 5})])
def test_a_whole_stack_equals_the_stack_before(name, options, before):
    new, old = twin_stacks(name, options, REFERENCES if before == "pre-rewrite" else CURRENT)
    new.double(), old.double()
    x = torch.randn(2, 8, D, dtype=torch.float64)
    outputs, grads = [], []
    for model in (new, old):
        inp = x.clone().requires_grad_()
        out = model(inp)
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
        outputs.append(out.detach())
        grads.append({"input": inp.grad} | {n: p.grad for n, p in model.named_parameters()})
    assert_close(outputs[0], outputs[1], "output", STACK_ATOL[name], STACK_RTOL)
    assert grads[0].keys() == grads[1].keys()
    for n in grads[1]:
        assert_close(grads[0][n], grads[1][n], n, STACK_ATOL[name], STACK_RTOL)


@pytest.mark.parametrize("iters", [1, 3, 20])
def test_sinkhorns_recomputing_backward_equals_autograd_through_the_loop(iters):
    torch.manual_seed(iters)
    logits = 2.0 * torch.randn(6, 5, 4, 4)
    # Column 0 of the first matrices sums to less than eps after the first row step (e^-20 a row): the floored
    # normalisations' gradient path.
    logits[0, :, :, 0] = -20.0
    logits[1, :, 1, :] = 80.0  # and a row far above the others: the maximum subtracted before exp matters
    direction = torch.randn(6, 5, 4, 4)
    results = []
    for fn in (sinkhorn_knopp, reference_sinkhorn_knopp):
        leaf = logits.clone().requires_grad_()
        out = fn(leaf, iters)
        (out * direction).sum().backward()
        results.append((out.detach(), leaf.grad))
    torch.testing.assert_close(results[0][0], results[1][0], atol=0, rtol=0)  # the same forward ops: bitwise
    assert_close(results[0][1], results[1][1], "logits")
    assert results[1][1][0].abs().sum() > 0


def saved_bytes(fn, *args) -> int:
    """Bytes of the distinct storages autograd keeps for the backward of fn(*args)."""
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*args)
    return sum(storages.values())


def test_sinkhorn_keeps_only_its_logits_for_the_backward():
    logits = torch.randn(64, 4, 4, requires_grad=True)
    reference = saved_bytes(reference_sinkhorn_knopp, logits, 20)
    assert saved_bytes(sinkhorn_knopp, logits, 20) == logits.nbytes
    assert reference > 40 * logits.nbytes  # the loop kept each normalisation's tensors


@pytest.mark.parametrize("name", ["hyperconn", "hyperconn_static", "mhc"])
def test_a_sublayer_keeps_less_for_the_backward_than_before(name):
    # One sublayer: the rewrite keeps at most what the pre-rewrite merge kept, the streams once (not a transposed
    # copy of them per mix).
    merge = shaken_merge(name, {"streams": 4}, seed=3)
    reference = REFERENCES[name](merge)
    h = torch.randn(2, 8, 4, D, requires_grad=True)
    y = torch.randn(2, 8, D, requires_grad=True)

    def sublayer(m):
        history = ResidualHistory(recording=False)
        return m(h, m.branch_input(h, history) * y, history)

    new, old = saved_bytes(sublayer, merge), saved_bytes(sublayer, reference)
    assert new < old, (new, old)


@pytest.mark.parametrize("autocast", [False, True])
@pytest.mark.parametrize("name", ["hyperconn", "hyperconn_static", "mhc"])
def test_a_sublayer_keeps_no_more_for_the_backward_than_the_merge_before(name, autocast):
    # Against c7f3728's merge: no more, and under autocast less (the merge keeps the bf16 branch, not a float32 copy).
    merge = shaken_merge(name, {"streams": 4}, seed=3)
    current = CURRENT[name](merge)
    h = torch.randn(2, 8, 4, D, requires_grad=True)
    w = torch.randn(D, D, requires_grad=True)

    def sublayer(m):
        history = ResidualHistory(recording=False)
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16, enabled=autocast):
            return m(h, m.branch_input(h, history) @ w, history)

    new, before = saved_bytes(sublayer, merge), saved_bytes(sublayer, current)
    assert new < before if autocast else new <= before, (new, before)

