"""Parameter roles: every trainable parameter of every registered plugin, in the GPT and the ViT, has exactly one
declared role; weight decay and the diagnostics' per-layer groups read it and did not change when they moved
from shapes and module paths to roles; fused matrices expose their logical parts."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from arch_plugins import registry
from arch_plugins.declarations import (
    UNDECLARED,
    ParameterRole,
    UndeclaredRoleError,
    decays,
    declare_role,
    declared_weight_decay,
    dense_role,
    parameter_roles,
    role_table,
)
from arch_plugins.interfaces import Kind, NormStrategy, Role, Site
from lit.diagnostics.norms import ParameterGroups
from lit.models.gpt import GPT
from lit.models.transformer import MLP, TransformerConfig
from lit.models.vit import ViT
from lit.optim import adamw

KINDS = ("norm", "residual", "projection")


@pytest.fixture(autouse=True, scope="module")
def entry_points_read_once():
    """Building a stack reads the installed plugins' metadata (about 0.2 s a time); read it once for this module
    (in-process registrations still count: they are part of the key)."""
    read, cache = registry._specs, {}

    def cached(kind):
        key = (kind, tuple(registry._LOCAL.get(kind, {})))
        if key not in cache:
            cache[key] = read(kind)
        return cache[key]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(registry, "_specs", cached)
        yield


EVERY_PLUGIN = [(kind, name) for kind in KINDS for name in registry.names(kind)]
# Stabilisers add parameters on top of any norm (QK-norm's gains); bias=True adds the projections' biases.
EXTRAS = {"plain": {}, "bias+qknorm+softcap": dict(bias=True, qk_norm="layernorm", logit_softcap=30.0)}


# Options a plugin needs to build at this test's size (3PT's phases must divide the 2 heads; its position profile
# is for sequences).
SMALL_OPTIONS = {("norm", "3pt"): {"gpt": {"phases": 2}, "vit": {"phases": 2, "horn": False}}}


def build(stack: str, kind: str, name: str, **arch) -> nn.Module:
    options = SMALL_OPTIONS.get((kind, name), {}).get(stack, {})
    cfg = TransformerConfig(d_model=32, n_layers=2, n_heads=2, **{kind: name, f"{kind}_options": options}, **arch)
    if stack == "gpt":
        return GPT(64, 16, cfg)
    return ViT(10, 8, 4, 3, cfg, pooling="cls", pos_embed="learned")


def build_with_extras(stack: str, kind: str, name: str, **arch) -> nn.Module:
    """``build`` with what a plugin refuses left out (Pattention has no bias; nGPT's norm does its own q, k)."""
    for refused in (None, "qk_norm", "bias"):
        arch.pop(refused, None)
        try:
            return build(stack, kind, name, **arch)
        except registry.PluginError:
            continue
    raise AssertionError(f"{kind} {name} refuses bias, qk_norm and softcap together")


def trainable(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def all_models():
    for kind, name in EVERY_PLUGIN:
        for stack in ("gpt", "vit"):
            # The stabilisers and biases live in the blocks, which both stacks share: once is enough for the ViT.
            for extra, arch in EXTRAS.items() if stack == "gpt" else [("plain", {})]:
                yield f"{stack}-{kind}-{name}-{extra}", (
                    lambda s=stack, k=kind, n=name, a=arch: build_with_extras(s, k, n, **a))


MODELS = dict(all_models())


def old_decay_rule(model: nn.Module) -> dict[int, bool]:
    """The optimizer's rule before roles: ``ndim >= 2``, unless a module declared otherwise."""
    result = {id(p): p.dim() >= 2 for p in model.parameters()}
    for param, decay in declared_weight_decay(model):
        result[id(param)] = decay
    return result


def test_the_optimizer_groups_are_unchanged():
    model = build("gpt", "residual", "hyperconn", bias=True, positions="learned")
    old = old_decay_rule(model)
    groups = adamw(model, 1e-3, 0.1, (0.9, 0.95)).param_groups
    params = trainable(model)
    assert [[id(p) for p in g["params"]] for g in groups] == [
        [id(p) for p in params if old[id(p)]], [id(p) for p in params if not old[id(p)]]]
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0]


def test_tied_embeddings_have_one_role():
    model = GPT(64, 16, TransformerConfig(d_model=32, n_layers=1, n_heads=2), tie_embeddings=True)
    roles = {r.name: r.role for r in parameter_roles(model)}
    assert roles["tok.weight"] == Role.EMBEDDING and "head.weight" not in roles  # one tensor, listed once


def test_a_parameter_declared_as_two_things_is_refused():
    model = GPT(64, 16, TransformerConfig(d_model=32, n_layers=1, n_heads=2), tie_embeddings=True)
    declare_role(model.head, "weight", Role.HEAD)
    with pytest.raises(UndeclaredRoleError, match="exactly one role"):
        parameter_roles(model)


class _Undeclared(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.w = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * self.w


class _UndeclaredNorm(NormStrategy):
    """A norm whose module declares no role."""

    def site(self, site, dim, layer, stack):
        return _Undeclared(dim) if site == Site.FINAL else None


def test_an_undeclared_parameter_fails_and_says_how_to_declare():
    registry.register("norm", "undeclared_for_test", _UndeclaredNorm)
    try:
        model = build("gpt", "norm", "undeclared_for_test")
    finally:
        registry.unregister("norm", "undeclared_for_test")
    with pytest.raises(UndeclaredRoleError, match=r"stack\.final\.w .* declare_role\(self, 'w', Role\.GAIN\)"):
        parameter_roles(model)
    loose = {r.name: r.role for r in parameter_roles(model, strict=False)}
    assert loose["stack.final.w"] == UNDECLARED
    assert decays(model)[id(model.stack.final.w)] is False  # still the old shape rule, so training goes on


def test_fused_matrices_expose_their_logical_parts():
    model = build("gpt", "projection", "linear")
    roles = {r.name: r for r in parameter_roles(model)}
    qkv, up = roles["stack.blocks.0.attn.qkv.weight"], roles["stack.blocks.0.mlp.up.weight"]
    assert qkv.role == "q|k|v" and qkv.kind == Kind.HIDDEN
    assert qkv.slices == (("q", 0, 32), ("k", 32, 64), ("v", 64, 96))
    hidden = model.stack.blocks[0].mlp.up.weight.shape[0] // 2
    assert up.slices == (("mlp_in", 0, hidden), ("mlp_gate", hidden, 2 * hidden))
    module, start, stop = dense_role(model.stack.blocks[0], Role.V)
    assert module is model.stack.blocks[0].attn.qkv and (start, stop) == (64, 96)
    # Pattention's parameter tokens are not a matrix applied to the input: no q/k/v rows to find there.
    assert dense_role(build("gpt", "projection", "pattention").stack.blocks[0], Role.V) is None


def test_bad_declarations_are_refused():
    linear = nn.Linear(4, 6)
    with pytest.raises(ValueError, match="tile its 6 rows"):
        declare_role(linear, "weight", {Role.Q: (0, 2), Role.K: (3, 6)})
    with pytest.raises(ValueError, match="share one kind"):
        declare_role(linear, "weight", {Role.Q: (0, 3), Role.HEAD: (3, 6)})
    with pytest.raises(ValueError, match=r"kind=Kind\.VECTOR"):
        declare_role(linear, "bias", "my_role")
    with pytest.raises(ValueError, match="unknown kind"):
        declare_role(linear, "bias", "my_role", kind="matrix")
    with pytest.raises(ValueError, match="no parameter 'nope'"):
        declare_role(linear, "nope", Role.BIAS)


def old_block_group(block, path: str) -> str:
    """The diagnostics' per-layer group before roles, parsed from the block's submodule names."""
    parts = path.split(".")
    first, second = parts[0], (parts[1] if len(parts) > 2 else "")
    if first == "attn":
        return {"qkv": "qkv", "out": "attn_out", "qk": "norms", "qk_before_rope": "norms"}.get(second, "other")
    if first == "mlp":
        if not isinstance(block.mlp, MLP):
            return "ffn"
        return {"up": "mlp_in", "down": "mlp_out", "hidden": "norms"}.get(second, "other")
    if first.endswith("_merge"):
        return "residual"
    if first.endswith(("_in", "_out", "_after_add")):
        return "norms"
    return "other"


def old_groups(model: nn.Module) -> set[str]:
    groups = {"global"}
    for index, block in enumerate(model.stack.blocks):
        groups |= {f"layer{index:02d}", *(f"layer{index:02d}.{old_block_group(block, path)}"
                                          for path, _ in block.named_parameters())}
    return groups


@pytest.mark.parametrize("case", list(MODELS))
def test_every_parameter_of_every_plugin_has_exactly_one_role(case):
    """Also: decay by role is the old shape rule, and the diagnostics' groups (metric names ``diag/*/layerNN.<group>``)
    are the ones module paths gave, for every plugin."""
    model = MODELS[case]()
    roles = parameter_roles(model)  # strict: an undeclared parameter raises, naming it and how to declare
    assert [id(r.param) for r in roles] == [id(p) for p in trainable(model)]  # each once, none missing
    for r in roles:
        assert r.kind in Kind.ALL and r.role != UNDECLARED
        if r.role in (Role.EMBEDDING, Role.HEAD):  # never routed to a hidden-matrix optimizer by shape
            assert r.kind == r.role
        if r.slices:
            assert r.slices[0][1] == 0 and r.slices[-1][2] == r.param.shape[0]
    by_id = {id(r.param): r.role for r in roles}
    embedding = model.tok.weight if isinstance(model, GPT) else model.patch.weight
    assert (by_id[id(embedding)], by_id[id(model.head.weight)]) == (Role.EMBEDDING, Role.HEAD)
    assert decays(model) == old_decay_rule(model)
    assert set(ParameterGroups(model).groups) == old_groups(model)


def test_the_role_table_counts_every_parameter_and_is_logged(tmp_path):
    from lightning.pytorch.loggers import MLFlowLogger

    from lit.callbacks import LogRoleTable

    model = build("gpt", "residual", "hyperconn", bias=True)
    rows = {r["role"]: r for r in role_table(model, strict=True)}
    assert sum(r["parameters"] for r in rows.values()) == sum(p.numel() for p in trainable(model))
    d, layers = 32, 2
    assert rows["q"]["parameters"] == rows["k"]["parameters"] == layers * d * d  # fused q|k|v counted per part
    assert rows["hc_dynamic_alpha"]["kind"] == Kind.READOUT and rows["hc_dynamic_alpha"]["decay"] is True

    logged = {}

    class Client:
        def log_dict(self, run_id, dictionary, artifact_file):
            logged[(run_id, artifact_file)] = json.loads(json.dumps(dictionary))  # what MLflow would store

    class Logger(MLFlowLogger):  # the callback's own check, without a tracking store to start
        experiment, run_id = Client(), "run-1"

    LogRoleTable().on_fit_start(SimpleNamespace(loggers=[object.__new__(Logger)]), model)
    assert {r["role"] for r in logged[("run-1", "roles.json")]["roles"]} == set(rows)


def test_parameter_role_is_what_optimizers_route_on():
    """The next optimizers split by ``kind``; a fused parameter's parts all share it (one Muon call per part)."""
    model = build("gpt", "projection", "linear")
    by_kind: dict[str, list[ParameterRole]] = {}
    for r in parameter_roles(model):
        by_kind.setdefault(r.kind, []).append(r)
    assert {r.role for r in by_kind[Kind.HIDDEN]} == {"q|k|v", "attn_out", "mlp_in|mlp_gate", "mlp_out"}
    assert [r.name for r in by_kind[Kind.EMBEDDING]] == ["tok.weight"]
    assert [r.name for r in by_kind[Kind.HEAD]] == ["head.weight"]
