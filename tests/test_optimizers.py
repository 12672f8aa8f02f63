"""Optimizers by role (``--model.optimizer``): AdamW with per-role multipliers, Muon for hidden matrices."""

from __future__ import annotations

import copy as copy_module

import pytest
import torch
from torch import nn

from arch_plugins import registry
from arch_plugins.declarations import decays, declare_optimizer_scale, declare_role, parameter_roles
from arch_plugins.interfaces import Kind, Role
from arch_plugins.optimizers.adamw import AdamWOptimizer
from arch_plugins.optimizers.muon import MuonOptimizer
from arch_plugins.registry import PluginError
from lit.models import GPT, TransformerConfig

SMALL = TransformerConfig(d_model=32, n_layers=2, n_heads=4, bias=True, mlp="swiglu")


def gpt(**arch) -> GPT:
    torch.manual_seed(0)
    return GPT(50, 8, TransformerConfig(**{**SMALL.__dict__, **arch}))


def train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int = 4, seed: int = 1) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx = torch.randint(0, 50, (2, 8), generator=g)
        loss = nn.functional.cross_entropy(model(idx).flatten(0, 1), idx.roll(-1, 1).flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def previous_adamw(model: nn.Module, lr: float, weight_decay: float, betas) -> torch.optim.AdamW:
    """The optimizer as the project built it before optimizers were plugins (decay / no-decay groups)."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = decays(model)
    groups = [{"params": [p for p in params if decay[id(p)]], "weight_decay": weight_decay},
              {"params": [p for p in params if not decay[id(p)]], "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, betas=betas)


# --- adamw ---------------------------------------------------------------------------------------------------------

def test_default_adamw_is_the_previous_optimizer_bitwise():
    old_model, new_model = gpt(), gpt()
    old = previous_adamw(old_model, 3e-3, 0.1, (0.9, 0.95))
    new = registry.create("optimizer", "adamw", {}).build(new_model, lr=3e-3, weight_decay=0.1, betas=(0.9, 0.95))
    assert len(old.param_groups) == len(new.param_groups) == 2
    for a, b in zip(old.param_groups, new.param_groups, strict=True):
        assert [n for n, p in old_model.named_parameters() if any(p is q for q in a["params"])] == \
               [n for n, p in new_model.named_parameters() if any(p is q for q in b["params"])]
        assert {k: v for k, v in a.items() if k != "params"} == {k: v for k, v in b.items()
                                                                 if k not in ("params", "lr_ratio")}
    train(old_model, old)
    train(new_model, new)
    for (name, a), b in zip(old_model.named_parameters(), new_model.parameters(), strict=True):
        assert torch.equal(a, b), name


def lr_of(optimizer: torch.optim.Optimizer) -> dict[int, tuple[float, float]]:
    return {id(p): (g["lr"], g["weight_decay"]) for g in optimizer.param_groups for p in g["params"]}


def test_adamw_multipliers_follow_roles_then_kinds():
    model = gpt()
    opt = AdamWOptimizer(lr_multipliers={"embedding": 0.3, "head": 0.003125, "vector": 0.01, "mlp_out": 2},
                         wd_multipliers={"head": 0.5, "vector": 7})
    found = lr_of(opt.build(model, lr=1e-2, weight_decay=0.1, betas=(0.9, 0.95)))
    for p in parameter_roles(model):
        lr, wd = found[id(p.param)]
        expected_lr = {"embedding": 0.3, "head": 0.003125, "mlp_out": 2.0}.get(
            p.role, 0.01 if p.kind == Kind.VECTOR else 1.0)
        assert lr == pytest.approx(1e-2 * expected_lr), p.name
        expected_wd = 0.0 if p.kind == Kind.VECTOR else (0.05 if p.role == "head" else 0.1)  # vectors never decay
        assert wd == pytest.approx(expected_wd), p.name


def test_roles_may_have_their_own_betas():
    model = gpt()
    built = AdamWOptimizer(role_betas={"embedding": [0.8, 0.95], "vector": [0.7, 0.9]}).build(
        model, lr=1.0, weight_decay=0.1, betas=(0.9, 0.95))
    by_param = {id(p): g["betas"] for g in built.param_groups for p in g["params"]}
    for p in parameter_roles(model):
        expected = {"embedding": (0.8, 0.95), "vector": (0.7, 0.9)}.get(p.kind, (0.9, 0.95))
        assert by_param[id(p.param)] == expected, p.name
    with pytest.raises(PluginError, match="two numbers"):
        AdamWOptimizer(role_betas={"head": 0.9})


def test_a_parametrization_multiplies_in_its_own_scales():
    model = gpt()
    declare_optimizer_scale(model.head, "weight", lr=0.25, weight_decay=2.0)
    opt = AdamWOptimizer(lr_multipliers={"head": 0.5})
    found = lr_of(opt.build(model, lr=1.0, weight_decay=0.1, betas=(0.9, 0.95)))
    assert found[id(model.head.weight)] == (0.125, pytest.approx(0.2))


def test_bad_multipliers_are_one_line_errors():
    with pytest.raises(PluginError, match="must be a number"):
        AdamWOptimizer(lr_multipliers={"head": "big"})
    with pytest.raises(PluginError, match="'haed', which is no role or kind"):
        AdamWOptimizer(lr_multipliers={"haed": 0.1}).build(gpt(), lr=1.0, weight_decay=0.0, betas=(0.9, 0.95))
    with pytest.raises(PluginError, match="one learning rate"):  # fused q|k|v: one tensor, one Adam lr
        AdamWOptimizer(lr_multipliers={"q": 2.0}).build(gpt(), lr=1.0, weight_decay=0.0, betas=(0.9, 0.95))


# --- muon: equality with torch.optim.Muon --------------------------------------------------------------------------

class Matrices(nn.Module):
    """Plain hidden matrices of several shapes (tall, wide, square), declared as hidden roles."""

    def __init__(self, shapes, fused_rows=None):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(i, o, bias=False) for o, i in shapes)
        for layer in self.layers:
            declare_role(layer, "weight", Role.MLP_IN)
        if fused_rows is not None:
            declare_role(self.layers[0], "weight", fused_rows)

    def loss(self, x):
        return sum((layer.weight @ x[: layer.weight.shape[1]]).sin().sum() for layer in self.layers)


def step_both(ours_model, ours, reference_params, reference, steps=20):
    g = torch.Generator().manual_seed(3)
    for _ in range(steps):
        x = torch.randn(48, 5, generator=g)
        for params, opt, loss in ((list(ours_model.parameters()), ours, ours_model.loss(x)),
                                  (reference_params, reference, None)):
            opt.zero_grad()
            if loss is None:
                loss = sum((w @ x[: w.shape[1]]).sin().sum() for w in params)
            loss.backward()
            opt.step()


@pytest.mark.parametrize("adjust, torch_name", [("original", "original"), ("match_rms_adamw", "match_rms_adamw"),
                                                ("spectral", "spectral_unclamped")])
def test_muon_equals_torch_muon_on_plain_matrices(adjust, torch_name):
    shapes = [(48, 16), (16, 48), (32, 32)]
    torch.manual_seed(0)
    model = Matrices(shapes)
    reference_params = [nn.Parameter(layer.weight.detach().clone()) for layer in model.layers]
    ours = MuonOptimizer(lr=0.02, weight_decay=0.1, adjust_lr=adjust).build(model, lr=1e-3, weight_decay=0.0,
                                                                             betas=(0.9, 0.95))
    reference = torch.optim.Muon(reference_params, lr=0.02, weight_decay=0.1, adjust_lr_fn=torch_name)
    step_both(model, ours, reference_params, reference)
    for layer, expected in zip(model.layers, reference_params, strict=True):
        torch.testing.assert_close(layer.weight, expected, atol=1e-6, rtol=0)


def test_a_fused_matrix_is_orthogonalised_per_part_as_separate_matrices():
    # One (16 + 16 + 24, 32) weight declared q|k|v equals three separate matrices stepped by torch.optim.Muon.
    torch.manual_seed(0)
    fused = Matrices([(56, 32)], fused_rows={Role.Q: (0, 16), Role.K: (16, 32), Role.V: (32, 56)})
    parts = [nn.Parameter(fused.layers[0].weight.detach()[a:b].clone()) for a, b in ((0, 16), (16, 32), (32, 56))]
    ours = MuonOptimizer(lr=0.02, adjust_lr="original").build(fused, lr=1e-3, weight_decay=0.0, betas=(0.9, 0.95))
    reference = torch.optim.Muon(parts, lr=0.02, weight_decay=0.0)
    g = torch.Generator().manual_seed(3)
    for _ in range(10):
        x = torch.randn(32, 5, generator=g)
        ours.zero_grad()
        reference.zero_grad()
        (fused.layers[0].weight @ x).sin().sum().backward()
        (torch.cat(parts) @ x).sin().sum().backward()
        ours.step()
        reference.step()
    torch.testing.assert_close(fused.layers[0].weight, torch.cat(parts), atol=1e-6, rtol=0)


def test_orthogonalising_the_fused_block_whole_is_a_different_optimizer():
    torch.manual_seed(0)
    fused = Matrices([(48, 16)], fused_rows={Role.Q: (0, 16), Role.K: (16, 32), Role.V: (32, 48)})
    whole = nn.Parameter(fused.layers[0].weight.detach().clone())
    ours = MuonOptimizer(lr=0.02, adjust_lr="original").build(fused, lr=1e-3, weight_decay=0.0, betas=(0.9, 0.95))
    reference = torch.optim.Muon([whole], lr=0.02, weight_decay=0.0)
    x = torch.randn(16, 5)
    (fused.layers[0].weight @ x).sin().sum().backward()
    (whole @ x).sin().sum().backward()
    ours.step()
    reference.step()
    assert (fused.layers[0].weight - whole).abs().max() > 1e-3


def test_our_newton_schulz_is_torch_s_where_torch_has_one():
    from arch_plugins.optimizers.newton_schulz import orthogonalize

    torch_muon = pytest.importorskip("torch.optim._muon")
    generator = torch.Generator().manual_seed(0)
    for shape in ((8, 8), (16, 4), (4, 16)):
        g = torch.randn(*shape, generator=generator)
        ours = orthogonalize(g)
        theirs = torch_muon._zeropower_via_newtonschulz(g, (3.4445, -4.7750, 2.0315), 5, 1e-7)
        assert ours.dtype == torch.bfloat16 and torch.equal(ours, theirs)
    with pytest.raises(ValueError, match="matrix"):
        orthogonalize(torch.randn(3, 3, 3))


# --- muon: routing --------------------------------------------------------------------------------------------------

def test_muon_routes_hidden_matrices_only_and_what_the_recipe_says():
    model = gpt()
    routing = MuonOptimizer().routing(model)
    roles = {p.name: p for p in parameter_roles(model)}
    assert set(routing) == set(roles)
    for name, where in routing.items():
        assert where == ("muon" if roles[name].kind == Kind.HIDDEN else "adamw"), name
    assert routing["tok.weight"] == routing["head.weight"] == "adamw"  # 2-D, but never Muon's
    assert {roles[n].role for n, w in routing.items() if w == "muon"} == {
        "q|k|v", "attn_out", "mlp_in|mlp_gate", "mlp_out"}
    moved = MuonOptimizer(adamw_roles=["mlp_out"]).routing(model)
    assert {roles[n].role for n, w in moved.items() if w == "muon"} == {"q|k|v", "attn_out", "mlp_in|mlp_gate"}


def test_muon_groups_carry_the_recipe_settings():
    model = gpt()
    opt = MuonOptimizer(lr=0.02, weight_decay=0.01, adjust_lr="original", lr_multipliers={"mlp_out": 2, "head": 0.5})
    built = opt.build(model, lr=1e-3, weight_decay=0.1, betas=(0.8, 0.95))
    by_param = {id(p): g for g in built.param_groups for p in g["params"]}
    for p in parameter_roles(model):
        group = by_param[id(p.param)]
        if p.kind == Kind.HIDDEN:
            assert group["muon"] and group["weight_decay"] == 0.01 and group["adjust_lr"] == "original"
            assert group["lr"] == pytest.approx(0.04 if p.role == "mlp_out" else 0.02)
            assert group["lr_ratio"] == pytest.approx(group["lr"] / 1e-3)
        else:
            assert not group["muon"] and group["betas"] == (0.8, 0.95)
            assert group["lr"] == pytest.approx(5e-4 if p.role == "head" else 1e-3)
    qkv = next(p for p in parameter_roles(model) if p.role == "q|k|v")
    group = by_param[id(qkv.param)]
    assert group["slices"][[id(q) for q in group["params"]].index(id(qkv.param))] == [(0, 32), (32, 64), (64, 96)]


def test_the_run_logs_the_optimizer_of_each_role():
    from arch_plugins.optimizers.routing import optimizer_settings

    model = gpt()
    built = MuonOptimizer(lr=0.02, lr_multipliers={"mlp_out": 2}).build(model, lr=1e-3, weight_decay=0.1,
                                                                         betas=(0.9, 0.95))
    table = optimizer_settings(model, built)
    assert table["q"] == table["v"] == {"optimizer": "muon", "lr_ratio": pytest.approx(20.0), "weight_decay": 0.1}
    assert table["mlp_out"]["lr_ratio"] == pytest.approx(40.0)
    assert table["head"] == {"optimizer": "adamw", "lr_ratio": 1.0, "weight_decay": 0.1}
    assert table["gain"]["weight_decay"] == 0.0


def test_muon_refuses_what_it_cannot_route():
    model = gpt()
    model.extra = nn.Parameter(torch.ones(4, 4))  # no role
    with pytest.raises(PluginError, match="muon routes parameters by their declared role"):
        MuonOptimizer().build(model, lr=1e-3, weight_decay=0.0, betas=(0.9, 0.95))
    cube = nn.Module()
    cube.w = nn.Parameter(torch.ones(2, 3, 4))
    declare_role(cube, "w", "experts", kind=Kind.HIDDEN)
    with pytest.raises(PluginError, match="adamw_roles=\\[experts\\]"):
        MuonOptimizer().build(cube, lr=1e-3, weight_decay=0.0, betas=(0.9, 0.95))
    MuonOptimizer(adamw_roles=["experts"]).build(cube, lr=1e-3, weight_decay=0.0, betas=(0.9, 0.95))
    with pytest.raises(PluginError, match="adjust_lr 'keller'"):
        MuonOptimizer(adjust_lr="keller")


def test_muon_trains_and_its_state_round_trips():
    model = gpt()
    opt = MuonOptimizer(lr=0.02, adjust_lr="original").build(model, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95))
    train(model, opt, steps=2)
    copy = gpt()
    copy.load_state_dict(model.state_dict())
    again = MuonOptimizer(lr=0.02, adjust_lr="original").build(copy, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95))
    again.load_state_dict(copy_module.deepcopy(opt.state_dict()))  # a saved state shares no tensor
    train(model, opt, steps=2, seed=5)
    train(copy, again, steps=2, seed=5)
    for a, b in zip(model.parameters(), copy.parameters(), strict=True):
        assert torch.equal(a, b)


# --- the FineWeb track-3 recipes say what the reference does ---------------------------------------------------------

@pytest.mark.parametrize("recipe", ["gpt_fineweb_track3.yaml", "gpt_fineweb_track3_muon.yaml"])
def test_the_track3_recipes_give_each_role_the_reference_settings(recipe):
    import yaml

    from lit.optim import select_optimizer
    from tests.conftest import REPO

    model_args = yaml.safe_load((REPO / "recipes" / recipe).read_text())["model"]["init_args"]
    arch = {**model_args["arch"], "d_model": 64, "n_layers": 2, "n_heads": 2}
    torch.manual_seed(0)
    model = GPT(100, 16, TransformerConfig(**arch))
    built = select_optimizer(model_args["optimizer"], model_args["optimizer_options"]).build(
        model, lr=model_args["lr"], weight_decay=model_args["weight_decay"], betas=tuple(model_args["betas"]))
    by_param = {id(p): g for g in built.param_groups for p in g["params"]}
    muon = recipe.endswith("_muon.yaml")
    reference = {  # (lr, weight decay, betas) of modded-nanogpt's track-3 baselines
        Kind.EMBEDDING: (0.3, 0.0, (0.8, 0.95)), Kind.HEAD: (1 / 320, 0.0, (0.8, 0.95)),
        Kind.VECTOR: (0.01, 0.0, (0.8, 0.95)),
        Kind.HIDDEN: (0.02, 0.01, None) if muon else (1.5e-3, 0.1, (0.9, 0.95))}
    kinds = set()
    for p in parameter_roles(model):
        group, (lr, wd, betas) = by_param[id(p.param)], reference[p.kind]
        kinds.add(p.kind)
        assert group["lr"] == pytest.approx(lr, rel=1e-12) and group["weight_decay"] == wd, p.name
        assert group["eps"] == 1e-10 and group.get("muon", False) == (muon and p.kind == Kind.HIDDEN), p.name
        if betas is not None:
            assert group["betas"] == betas, p.name
        else:
            assert group["adjust_lr"] == "original" and group["momentum"] == 0.95 and group["nesterov"]
    assert kinds == set(reference)
