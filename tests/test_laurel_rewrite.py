"""Issue 43: LAUREL's merge rewritten twice for fewer ops per step, each time on the promise that the math does not
change; both earlier forms are kept here and the module today must compute what each computed.

- ``accumulator_forward``: ``LaurelMerge.forward`` at commit 9d0b527, before the first rewrite: a zeros
  accumulator, one low-rank term at a time. The first rewrite took the merge without the accumulator, the low-rank
  terms as one up-GEMM (K = terms x rank over the down projections side by side, each scaled by beta gamma_j) and
  one epilogue expression.
- ``fused_forward`` and ``fused_low_rank``: ``LaurelMerge.forward`` and ``_low_rank`` at commit c7f3728, that first
  rewrite, before the second: the second hands the earlier streams' low-rank terms (PA with LR) to a function with a
  backward written out (``_LowRankSum``), so that each A_j and B_j receives its gradient in its own layout, and calls
  the batched GEMM without matmul's reshapes.

Every variant, both placements and both combinations of RW+LR+PA are compared on the same random parameters and
streams: the output and the gradients of h, the branch, every stream of the history and every parameter, in fp32.
Against the accumulator form the sums are taken in another order (alpha (h + branch) + (beta - alpha) x_i against
alpha (h - x_i + branch) + beta x_i; the low-rank terms summed inside one GEMM), so the comparison is to fp32
rounding on O(1) values: atol 1e-5, rtol 1e-5; the same against the first rewrite, whose products the second sums
in other GEMMs (a weight's gradient from a batched product of its own instead of a block of one wide one). Under
bf16 autocast, as a GPU run computes, the second rewrite must also keep the first's dtypes and agree with it to
bf16 rounding.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from arch_plugins import registry
from arch_plugins.interfaces import ResidualHistory, StackInfo
from arch_plugins.residuals.laurel import LaurelMerge

D = 48  # above the default rank 32
INFO = StackInfo(D, 4, 4, 96, causal=True)
ATOL, RTOL = 1e-5, 1e-5  # fp32 rounding of sums taken in another order, on values of order 1-10


def accumulator_forward(self, h, branch, history):
    """LaurelMerge.forward at commit 9d0b527: a zeros accumulator, one low-rank term at a time."""
    earlier = history.block_inputs if self.wraps_block else history.states
    x_i = earlier[-1] if self.wraps_block else h
    terms = self.gamma.shape[0] if self.gamma is not None else 1
    xs = [x_i] + [earlier[-1 - j] for j in range(1, terms)]
    delta = torch.zeros_like(x_i)
    for j, x in enumerate(xs):
        gamma = self.gamma[j] if self.gamma is not None else None
        if gamma is not None and not self.eq6:
            delta = delta + (gamma - 1 if j == 0 else gamma) * x
        if self.low_rank is not None:
            lr = self.low_rank[j](x)
            delta = delta + (lr if gamma is None else gamma * lr)
    if self.rw_logits is None:
        return h + branch + delta
    alpha, beta = self.alpha_beta()
    f = (h - x_i + branch) if self.wraps_block else branch
    return alpha * f + beta * (x_i + delta)


def fused_forward(self, h, branch, history):
    """LaurelMerge.forward at commit c7f3728: no accumulator, one epilogue (``fused_low_rank`` for the terms)."""
    earlier = history.block_inputs if self.wraps_block else history.states
    x_i = earlier[-1] if self.wraps_block else h
    terms = self.gamma.shape[0] if self.gamma is not None else 1
    xs = [x_i] + [earlier[-1 - j] for j in range(1, terms)]
    alpha, beta = self.alpha_beta() if self.rw_logits is not None else (None, None)
    out = fused_low_rank(self, xs, beta)
    if alpha is None:
        out = h + branch if out is None else out + h + branch
    else:
        base = h + branch if self.wraps_block else branch
        out = base * alpha if out is None else out + base * alpha
    identity = self.gamma is not None and not self.eq6
    for j, x in enumerate(xs):
        if not identity and j > 0:
            break
        carried = self.gamma[j] if identity else None
        if alpha is None:
            coefficient = (carried - 1.0 if j == 0 else carried) if carried is not None else None
        else:
            coefficient = beta if carried is None else carried * beta
            if j == 0 and self.wraps_block:
                coefficient = coefficient - alpha
        if coefficient is not None:
            out = out + x * coefficient
    return out


def fused_low_rank(self, xs, beta):
    """LaurelMerge._low_rank at commit c7f3728: one batched down GEMM (matmul), one up-GEMM, autograd's backward."""
    if self.low_rank is None:
        return None
    scale = self.gamma
    if beta is not None:
        scale = beta if scale is None else scale * beta
    if len(xs) == 1:
        down, up = F.linear(xs[0], self.low_rank[0].down.weight), self.low_rank[0].up.weight
        if scale is not None:
            up = up * scale
    else:
        streams = torch.stack(xs).reshape(len(xs), -1, xs[0].shape[-1])
        downs = streams @ torch.stack([lr.down.weight for lr in self.low_rank]).transpose(1, 2)
        down = downs.movedim(0, 1).reshape(*xs[0].shape[:-1], -1)
        up = torch.stack([lr.up.weight for lr in self.low_rank], dim=1)
        if scale is not None:
            up = up * scale.unsqueeze(-1)
        up = up.flatten(1)
    return F.linear(down, up)


REFERENCES = {"accumulator-9d0b527": accumulator_forward, "fused-c7f3728": fused_forward}


VARIANTS = [
    ("laurel_rw", {}), ("laurel_rw", {"weights": "sigmoid"}),
    ("laurel_lr", {"rank": 4}), ("laurel_lr", {"rank": 4, "a_init": "xavier"}),
    ("laurel_pa", {}), ("laurel_pa", {"rank": 4}),
    ("laurel_rw_lr", {"rank": 4}),
    ("laurel_rw_lr_pa", {"rank": 4}), ("laurel_rw_lr_pa", {"rank": 4, "combination": "legacy"}),
    ("laurel_rw_lr_pa", {"rank": 4, "weights": "sigmoid", "previous": 2}),
]


def merges(name: str, options: dict, placement: str, layer: int, reference) -> tuple[LaurelMerge, LaurelMerge]:
    """The merge with random parameters (none of them at its init's special 0 or 1), and a twin that runs the
    ``reference`` forward on copies of the same parameters."""
    torch.manual_seed(7)
    merge = registry.create("residual", name, {**options, "placement": placement}).merge("mlp", layer,
                                                                                                      INFO)
    with torch.no_grad():
        for p in merge.parameters():
            p.normal_(0.0, 0.5)
    twin = copy.deepcopy(merge)
    twin.forward = reference.__get__(twin)
    return merge, twin


def inputs(placement: str, layer: int) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    torch.manual_seed(11)
    n_states = 2 * layer + 2  # the embedding and every sublayer's input before this MLP merge
    states = [torch.randn(2, 5, D, requires_grad=True) for _ in range(n_states)]
    blocks = [torch.randn(2, 5, D, requires_grad=True) for _ in range(layer + 1)]
    h = states[-1] if placement == "sublayer" else torch.randn(2, 5, D, requires_grad=True)
    return h, torch.randn(2, 5, D, requires_grad=True), states, blocks


def run(module, placement: str, layer: int, autocast: bool = False, frozen_history: bool = False):
    """One forward and backward: (output, the inputs' gradients, the parameters' gradients by name)."""
    h, branch, states, blocks = inputs(placement, layer)
    if frozen_history:  # the earlier streams without gradients (h and the branch keep theirs)
        states, blocks = [t.detach() for t in states[:-1]] + [states[-1]], [t.detach() for t in blocks]
    if autocast:  # as the model hands them over under autocast: a float32 stream, a bf16 sublayer output
        branch = branch.detach().bfloat16().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = module(h, branch, ResidualHistory(states=states, block_inputs=blocks))
    (out * torch.linspace(-1.0, 1.0, out.numel()).view_as(out)).sum().backward()
    leaves = [h, branch, *states, *blocks]
    grads = [t.grad if t.grad is not None else torch.zeros_like(t) for t in dict.fromkeys(leaves)]
    return out, grads, {n: p.grad for n, p in module.named_parameters()}


def assert_same(results, atol: float, rtol: float) -> None:
    """Output and every gradient alike, dtypes included (assert_close compares them)."""
    (out, grads, params), (ref_out, ref_grads, ref_params) = results
    torch.testing.assert_close(out, ref_out, atol=atol, rtol=rtol, msg="output")
    for i, (g, ref) in enumerate(zip(grads, ref_grads, strict=True)):
        torch.testing.assert_close(g, ref, atol=atol, rtol=rtol, msg=f"gradient of input {i}")
    assert params.keys() == ref_params.keys()
    for n in params:
        torch.testing.assert_close(params[n], ref_params[n], atol=atol, rtol=rtol, msg=f"gradient of {n}")


@pytest.mark.parametrize("reference", REFERENCES)
@pytest.mark.parametrize("placement", ["block", "sublayer"])
@pytest.mark.parametrize("name,options", VARIANTS, ids=[f"{n}-{'-'.join(map(str, o.values())) or 'default'}"
                                                         for n, o in VARIANTS])
def test_the_merge_equals_each_earlier_form(name, options, placement, reference):
    layer = 2  # deep enough that PA reads all of its k = 3 streams
    merge, twin = merges(name, options, placement, layer, REFERENCES[reference])
    assert_same([run(module, placement, layer) for module in (merge, twin)], ATOL, RTOL)


@pytest.mark.parametrize("frozen", ["history", "down", "up", "gamma"])
@pytest.mark.parametrize("placement", ["block", "sublayer"])
def test_what_does_not_need_a_gradient_gets_none_and_the_rest_theirs(frozen, placement):
    """The written-out backward computes only the gradients asked for: the earlier streams without one (the
    history detached), or the down weights, the up weights or gamma frozen."""
    layer = 2
    merge, twin = merges("laurel_rw_lr_pa", {"rank": 4}, placement, layer, fused_forward)
    for module in (merge, twin):
        for name, p in module.named_parameters():
            if name.endswith(f"{frozen}.weight") or name == frozen:
                p.requires_grad_(False)
    results = [run(module, placement, layer, frozen_history=frozen == "history") for module in (merge, twin)]
    assert_same(results, ATOL, RTOL)
    assert all(g is None for n, g in results[0][2].items() if n.endswith(f"{frozen}.weight") or n == frozen)


@pytest.mark.parametrize("placement", ["block", "sublayer"])
@pytest.mark.parametrize("name,options", VARIANTS[-3:], ids=["eq6", "legacy", "sigmoid-k2"])
def test_under_bf16_autocast_the_merge_keeps_the_first_rewrite_s_dtypes_and_values(name, options, placement):
    """The low-rank GEMMs in bf16, their inputs' and the weights' gradients handed back in float32, as autocast's
    own casts did. Both forms round their operands to bf16 alike; the products are summed in other GEMMs, so the
    tolerance is bf16's (2 ** -8 relative) on values of order 1-10."""
    layer = 2
    merge, twin = merges(name, options, placement, layer, fused_forward)
    assert_same([run(module, placement, layer, autocast=True) for module in (merge, twin)], 4e-2, 1e-2)


@pytest.mark.parametrize("name", ["laurel_lr", "laurel_pa", "laurel_rw_lr_pa"])
@pytest.mark.parametrize("placement", ["block", "sublayer"])
def test_at_init_the_merge_is_the_plain_sum_bit_for_bit(name, placement):
    """Every coefficient is exactly 0 or 1 at init and B = 0: the fused expression adds exact zeros to h + branch.
    (The accumulator form rebuilt f = h - x_i + branch around a block, equal to the plain sum only to rounding.)"""
    merge = registry.create("residual", name, {"placement": placement}).merge("mlp", 2, INFO)
    h, branch, states, blocks = inputs(placement, 2)
    out = merge(h, branch, ResidualHistory(states=states, block_inputs=blocks))
    assert torch.equal(out, h + branch)
