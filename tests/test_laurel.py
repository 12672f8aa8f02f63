"""LAUREL residuals: registered by name, exactly `add` at init, the paper's formulas, learnable parts that learn."""

from __future__ import annotations

import math

import pytest
import torch

from arch_plugins import catalogue, registry
from arch_plugins.interfaces import ResidualHistory, StackInfo
from arch_plugins.residuals.add import Add
from arch_plugins.residuals.laurel import LaurelMerge
from lit.models.transformer import TransformerConfig, TransformerStack
from tests.conftest import plain_and_twin

NAMES = ["laurel_rw", "laurel_lr", "laurel_pa", "laurel_rw_lr", "laurel_rw_lr_pa"]
D, LAYERS, T = 32, 4, 12
INFO = StackInfo(D, LAYERS, 4, 96, causal=True)


def stack(causal: bool, seed: int = 0, **kw) -> TransformerStack:
    torch.manual_seed(seed)
    cfg = TransformerConfig(**{"d_model": D, "n_layers": LAYERS, "n_heads": 4, **kw})
    return TransformerStack(cfg, causal=causal, max_len=T)


def reference_and(causal: bool, **kw) -> tuple[TransformerStack, TransformerStack]:
    """A plain-residual stack with non-trivial norm gains, and a LAUREL one carrying the same weights."""
    return plain_and_twin(stack, causal, **kw)


def test_every_variant_is_registered():
    assert set(NAMES) <= set(registry.names("residual"))
    for name in NAMES:
        assert catalogue.summary(registry.spec("residual", name)).startswith("LAUREL-")


@pytest.mark.parametrize("name,options", [("laurel_lr", {"a_init": "xavier"}), ("laurel_pa", {"rank": 4})])
def test_lr_and_pa_move_off_add_once_their_own_parameters_move(name, options):
    # That they are exactly `add` at init is their declared init identity, checked by the conformance kit
    # (tests/test_every_plugin.py); here, that the identity is not vacuous.
    ref, laurel = reference_and(True, residual=name, residual_options={**options, "placement": "sublayer"})
    x = torch.randn(3, T, D)
    assert torch.equal(laurel(x), ref(x))
    with torch.no_grad():
        for name_, p in laurel.named_parameters():
            if "merge" in name_:
                p.add_(0.05)
    assert not torch.allclose(laurel(x), ref(x), atol=1e-4)


def history_of(n_states: int, n_blocks: int) -> tuple[ResidualHistory, torch.Tensor, torch.Tensor]:
    torch.manual_seed(3)
    states = [torch.randn(2, 5, D) for _ in range(n_states)]
    blocks = [torch.randn(2, 5, D) for _ in range(n_blocks)]
    return ResidualHistory(states=states, block_inputs=blocks), states[-1], torch.randn(2, 5, D)


def randomise(merge: LaurelMerge) -> None:
    with torch.no_grad():
        for p in merge.parameters():
            p.normal_(0.0, 0.5)


def rw_lr_pa_carry(merge: LaurelMerge, xs: list[torch.Tensor], combination: str) -> torch.Tensor:
    """The carry beta multiplies, by hand: eq. (6) x_i + sum_j g_j B_j A_j x_j; legacy sum_j g_j (I + B_j A_j) x_j."""
    low = [lr.up.weight @ lr.down.weight for lr in merge.low_rank]  # B_j A_j as one (d, d) matrix
    if combination == "eq6":
        return xs[0] + sum(g * x @ m.T for g, x, m in zip(merge.gamma, xs, low, strict=True))
    return sum(g * (x + x @ m.T) for g, x, m in zip(merge.gamma, xs, low, strict=True))


@pytest.mark.parametrize("combination", ["eq6", "legacy"])
def test_rw_lr_pa_formula_around_a_sublayer(combination):
    # The MLP of block 1 (0-based): the embedding and three sublayers came before, so 4 states, k = 3 used.
    merge = registry.create("residual", "laurel_rw_lr_pa", {"rank": 3, "placement": "sublayer",
                                                            "combination": combination}).merge("mlp", 1, INFO)
    randomise(merge)
    history, h, y = history_of(4, 2)
    alpha, beta = (2 * torch.softmax(merge.rw_logits, 0)).tolist()
    carry = rw_lr_pa_carry(merge, [h, history.states[-2], history.states[-3]], combination)
    torch.testing.assert_close(merge(h, y, history), alpha * y + beta * carry, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("combination", ["eq6", "legacy"])
def test_rw_lr_pa_formula_around_a_block(combination):
    # Once per block: x_i is the block's input, f the whole block, f(x_i) = h - x_i + y at the MLP merge.
    options = {"rank": 3, "combination": combination}
    merge = registry.create("residual", "laurel_rw_lr_pa", options).merge("mlp", 2, INFO)
    randomise(merge)
    history, h, y = history_of(6, 3)
    alpha, beta = (2 * torch.softmax(merge.rw_logits, 0)).tolist()
    x_i = history.block_inputs[-1]
    carry = rw_lr_pa_carry(merge, history.block_inputs[::-1], combination)
    torch.testing.assert_close(merge(h, y, history), alpha * (h - x_i + y) + beta * carry, atol=1e-5, rtol=1e-5)


def test_rw_lr_pa_defaults_to_the_papers_eq6_on_hand_made_tensors():
    """Paper eq. (6): x_{i+1} = alpha f(x_i) + beta (x_i + sum_j gamma_j A_j B_j x_{i-j}); no identity path on the
    earlier streams, no learned coefficient on x_i, gamma starting at 1. The old form added gamma_j x_{i-j}."""
    d, info = 2, StackInfo(2, 4, 1, 4, causal=True)
    merge = registry.create("residual", "laurel_rw_lr_pa", {"rank": 1, "placement": "sublayer"}).merge("mlp", 1, info)
    assert merge.gamma.tolist() == [1.0, 1.0, 1.0]
    with torch.no_grad():  # alpha = beta = 1; B_j A_j = [[0, j + 1], [0, 0]]: picks the second channel, times j + 1
        for j, lr in enumerate(merge.low_rank):
            lr.down.weight.copy_(torch.tensor([[0.0, 1.0]]))
            lr.up.weight.copy_(torch.tensor([[j + 1.0], [0.0]]))
        merge.gamma.copy_(torch.tensor([0.5, 2.0, -1.0]))
    x0, x1, x2 = torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0]), torch.tensor([5.0, 6.0])
    history = ResidualHistory(states=[torch.zeros(d), x2, x1, x0], block_inputs=[])
    y = torch.tensor([10.0, 20.0])
    # eq6: y + x0 + 0.5*[1*2, 0] + 2*[2*4, 0] - 1*[3*6, 0] = [10 + 1 + 1 + 16 - 18, 20 + 2]
    assert merge(x0, y, history).tolist() == [10.0, 22.0]
    legacy = registry.create("residual", "laurel_rw_lr_pa", {"rank": 1, "placement": "sublayer",
                                                             "combination": "legacy"}).merge("mlp", 1, info)
    assert legacy.gamma.tolist() == [1.0, 0.0, 0.0]
    legacy.load_state_dict(merge.state_dict())
    # legacy: y + 0.5*(x0 + [2, 0]) + 2*(x1 + [8, 0]) - 1*(x2 + [18, 0])
    assert legacy(x0, y, history).tolist() == [10.0 + 1.5 + 22.0 - 23.0, 20.0 + 1.0 + 8.0 - 6.0]


def test_lr_pa_and_rw_formulas():
    history, h, y = history_of(3, 1)  # MLP of block 0, sublayer placement
    lr = registry.create("residual", "laurel_lr", {"rank": 2, "placement": "sublayer"}).merge("mlp", 0, INFO)
    randomise(lr)
    low = lr.low_rank[0]
    torch.testing.assert_close(lr(h, y, history), y + h + low.up(low.down(h)))
    pa = registry.create("residual", "laurel_pa", {"placement": "sublayer"}).merge("mlp", 0, INFO)
    randomise(pa)
    g0, g1 = pa.gamma.tolist()  # k = 3, but only two streams exist before block 0's MLP merge
    torch.testing.assert_close(pa(h, y, history), y + g0 * h + g1 * history.states[-2])
    rw = registry.create("residual", "laurel_rw", {"weights": "sigmoid", "placement": "sublayer"}).merge("mlp", 0, INFO)
    randomise(rw)
    a, b = rw.rw_logits.tolist()
    torch.testing.assert_close(rw(h, y, history), 2 / (1 + math.exp(-a)) * y + 2 / (1 + math.exp(-b)) * h)


def test_rw_parametrisations_are_bounded_and_one_at_init():
    soft = registry.create("residual", "laurel_rw").merge("mlp", 0, INFO)
    sig = registry.create("residual", "laurel_rw", {"weights": "sigmoid"}).merge("mlp", 0, INFO)
    assert soft.alpha_beta().tolist() == [1.0, 1.0] == sig.alpha_beta().tolist()
    with torch.no_grad():
        soft.rw_logits.copy_(torch.tensor([30.0, -30.0]))
        sig.rw_logits.copy_(torch.tensor([30.0, 30.0]))
    assert soft.alpha_beta().sum().item() == pytest.approx(2.0) and soft.alpha_beta().max() <= 2.0
    assert sig.alpha_beta().max().item() <= 2.0


def test_structured_low_rank_init():
    lr = registry.create("residual", "laurel_lr", {"rank": 4}).merge("mlp", 0, INFO).low_rank[0]
    A = lr.down.weight  # (r, d): output j sums the inputs i with i mod r == j
    expected = torch.zeros(4, D)
    for i in range(D):
        expected[i % 4, i] = 1 / math.sqrt(4 * D)
    assert torch.equal(A, expected) and not lr.up.weight.any()


@pytest.mark.parametrize("placement,expected", [
    ("block", {("attn", 0): None, ("mlp", 0): 1, ("mlp", 1): 2, ("mlp", 3): 3}),
    ("sublayer", {("attn", 0): 1, ("mlp", 0): 2, ("attn", 1): 3, ("mlp", 3): 3})])
def test_pa_reads_the_streams_that_exist(placement, expected):
    pa = registry.create("residual", "laurel_pa", {"placement": placement})
    for (sublayer, layer), gammas in expected.items():
        merge = pa.merge(sublayer, layer, INFO)
        if gammas is None:
            assert isinstance(merge, Add)  # a block-wrapping LAUREL leaves the block's inner residual plain
        else:
            assert merge.gamma.tolist() == [1.0] + [0.0] * (gammas - 1)


def test_one_instance_per_block_matches_the_papers_parameter_count():
    # The paper's LLM-1B: RW+LR at rank 4 adds 2N(4D + 1) parameters for N layers.
    base = sum(p.numel() for p in stack(True).parameters())
    laurel = stack(True, residual="laurel_rw_lr", residual_options={"rank": 4})
    assert sum(p.numel() for p in laurel.parameters()) - base == 2 * LAYERS * (4 * D + 1)
    twice = stack(True, residual="laurel_rw_lr", residual_options={"rank": 4, "placement": "sublayer"})
    assert sum(p.numel() for p in twice.parameters()) - base == 2 * 2 * LAYERS * (4 * D + 1)


@pytest.mark.parametrize("causal", [True, False], ids=["lm", "encoder"])
def test_gradients_reach_every_learnable_part(causal):
    model = stack(causal, residual="laurel_rw_lr_pa", residual_options={"rank": 4})
    model(torch.randn(2, T, D)).square().mean().backward()
    grads = {n: p.grad for n, p in model.named_parameters() if "merge" in n}
    assert grads and all(g is not None for g in grads.values())
    for name, grad in grads.items():
        if name.endswith(("down.weight", "gamma")):
            # eq. (6): A and gamma learn once B has moved off zero; every B_j learns at once (gamma_j = 1).
            assert not grad.any(), name
        else:
            assert grad.abs().min() > 0, name  # rw_logits, every B_j


@pytest.mark.parametrize("causal", [True, False], ids=["lm", "encoder"])
def test_gradients_reach_every_learnable_part_legacy(causal):
    model = stack(causal, residual="laurel_rw_lr_pa", residual_options={"rank": 4, "combination": "legacy"})
    model(torch.randn(2, T, D)).square().mean().backward()
    grads = {n: p.grad for n, p in model.named_parameters() if "merge" in n}
    assert grads and all(g is not None for g in grads.values())
    for name, grad in grads.items():
        if name.endswith("down.weight") or (".up." in name and ".low_rank.0." not in name):
            # Zero-init couples: A learns once B has moved off zero, and B_j (j > 0) once gamma_j has.
            assert not grad.any(), name
        else:
            assert grad.abs().min() > 0, name  # rw_logits, every gamma (each multiplies a stream), B_0


@pytest.mark.parametrize("name,options,message", [
    ("laurel_rw", {"weights": "tanh"}, "give 'softmax' or 'sigmoid'"),
    ("laurel_lr", {"rank": 0}, "rank must be a positive integer"),
    ("laurel_pa", {"previous": 0}, "give an integer >= 1"),
    ("laurel_lr", {"placement": "attn"}, "placement must be 'block'"),
    ("laurel_lr", {"a_init": "orthogonal"}, "a_init must be 'structured'"),
    ("laurel_rw", {"rank": 4}, "has no option 'rank'"),
    ("laurel_rw_lr_pa", {"combination": "sum"}, "combination must be 'eq6'"),
])
def test_bad_options_say_what_to_do(name, options, message):
    with pytest.raises(registry.PluginError, match=message) as info:
        registry.create("residual", name, options)
    assert "\n" not in str(info.value)


def test_rank_above_width_is_refused_when_the_stack_is_built():
    with pytest.raises(registry.PluginError, match="set residual_options.rank to at most 32"):
        stack(True, residual="laurel_lr", residual_options={"rank": 64})
