"""Issue 43 item 2: LAUREL's merge without the zeros accumulator, its low-rank terms as one up-GEMM (K = terms x
rank over the down projections side by side, each scaled by beta gamma_j) and one epilogue expression, computes
what the accumulator form computed.

``reference_forward`` below is the pre-rewrite ``LaurelMerge.forward``, copied from commit 9d0b527 (the last commit
that touched ``arch_plugins/residuals/laurel.py`` before the rewrite). Every variant, both placements and both
combinations of RW+LR+PA are compared on the same random parameters and streams: the output and the gradients of
h, the branch, every stream of the history and every parameter, in fp32. The sums are taken in another order
(alpha (h + branch) + (beta - alpha) x_i against alpha (h - x_i + branch) + beta x_i; the low-rank terms summed
inside one GEMM), so the comparison is to fp32 rounding on O(1) values: atol 1e-5, rtol 1e-5.
"""

from __future__ import annotations

import copy

import pytest
import torch

from arch_plugins import registry
from arch_plugins.interfaces import ResidualHistory, StackInfo
from arch_plugins.residuals.laurel import LaurelMerge

D = 48  # above the default rank 32
INFO = StackInfo(D, 4, 4, 96, causal=True)
ATOL, RTOL = 1e-5, 1e-5  # fp32 rounding of sums taken in another order, on values of order 1-10


def reference_forward(self, h, branch, history):
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


VARIANTS = [
    ("laurel_rw", {}), ("laurel_rw", {"weights": "sigmoid"}),
    ("laurel_lr", {"rank": 4}), ("laurel_lr", {"rank": 4, "a_init": "xavier"}),
    ("laurel_pa", {}), ("laurel_pa", {"rank": 4}),
    ("laurel_rw_lr", {"rank": 4}),
    ("laurel_rw_lr_pa", {"rank": 4}), ("laurel_rw_lr_pa", {"rank": 4, "combination": "legacy"}),
    ("laurel_rw_lr_pa", {"rank": 4, "weights": "sigmoid", "previous": 2}),
]


def merges(name: str, options: dict, placement: str, layer: int) -> tuple[LaurelMerge, LaurelMerge]:
    """The rewritten merge with random parameters (none of them at its init's special 0 or 1), and a twin that
    runs the reference forward on copies of the same parameters."""
    torch.manual_seed(7)
    merge = registry.create("residual", name, {**options, "placement": placement}).merge("mlp", layer,
                                                                                                      INFO)
    with torch.no_grad():
        for p in merge.parameters():
            p.normal_(0.0, 0.5)
    twin = copy.deepcopy(merge)
    twin.forward = reference_forward.__get__(twin)
    return merge, twin


def inputs(placement: str, layer: int) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    torch.manual_seed(11)
    n_states = 2 * layer + 2  # the embedding and every sublayer's input before this MLP merge
    states = [torch.randn(2, 5, D, requires_grad=True) for _ in range(n_states)]
    blocks = [torch.randn(2, 5, D, requires_grad=True) for _ in range(layer + 1)]
    h = states[-1] if placement == "sublayer" else torch.randn(2, 5, D, requires_grad=True)
    return h, torch.randn(2, 5, D, requires_grad=True), states, blocks


@pytest.mark.parametrize("placement", ["block", "sublayer"])
@pytest.mark.parametrize("name,options", VARIANTS, ids=[f"{n}-{'-'.join(map(str, o.values())) or 'default'}"
                                                         for n, o in VARIANTS])
def test_the_fused_merge_equals_the_accumulator_form(name, options, placement):
    layer = 2  # deep enough that PA reads all of its k = 3 streams
    merge, twin = merges(name, options, placement, layer)
    results = []
    for module in (merge, twin):
        h, branch, states, blocks = inputs(placement, layer)
        out = module(h, branch, ResidualHistory(states=states, block_inputs=blocks))
        (out * torch.linspace(-1.0, 1.0, out.numel()).view_as(out)).sum().backward()
        leaves = [h, branch, *states, *blocks]
        grads = [t.grad if t.grad is not None else torch.zeros_like(t) for t in dict.fromkeys(leaves)]
        results.append((out, grads, {n: p.grad for n, p in module.named_parameters()}))
    (out, grads, params), (ref_out, ref_grads, ref_params) = results
    torch.testing.assert_close(out, ref_out, atol=ATOL, rtol=RTOL, msg="output")
    for i, (g, ref) in enumerate(zip(grads, ref_grads, strict=True)):
        torch.testing.assert_close(g, ref, atol=ATOL, rtol=RTOL, msg=f"gradient of input {i}")
    assert params.keys() == ref_params.keys()
    for n in params:
        torch.testing.assert_close(params[n], ref_params[n], atol=ATOL, rtol=RTOL, msg=f"gradient of {n}")


@pytest.mark.parametrize("name", ["laurel_lr", "laurel_pa", "laurel_rw_lr_pa"])
@pytest.mark.parametrize("placement", ["block", "sublayer"])
def test_at_init_the_merge_is_the_plain_sum_bit_for_bit(name, placement):
    """Every coefficient is exactly 0 or 1 at init and B = 0: the fused expression adds exact zeros to h + branch.
    (The accumulator form rebuilt f = h - x_i + branch around a block, equal to the plain sum only to rounding.)"""
    merge = registry.create("residual", name, {"placement": placement}).merge("mlp", 2, INFO)
    h, branch, states, blocks = inputs(placement, 2)
    out = merge(h, branch, ResidualHistory(states=states, block_inputs=blocks))
    assert torch.equal(out, h + branch)
