"""What a module tells the outside world about itself, declared where it is built and read without naming it.

The block, the optimizer, the callbacks and the diagnostics never match parameter names or know plugins: the
module that owns a parameter declares what the others need to know, once, in its ``__init__`` (or the code
that builds it, right after). Every declaration below is stored the same way, read by a walker over
``model.named_modules()``:

- ``declare_role(module, "weight", Role.ATTN_OUT)``: what a parameter is (its role, and the role's kind:
  hidden matrix, embedding, head, vector, scalar), read by ``parameter_roles(model)`` for optimizers,
  parametrizations, weight decay, diagnostics and the run's role table. A fused matrix declares its row
  slices (``{Role.Q: (0, d), Role.K: (d, 2 d), Role.V: (2 d, 3 d)}``), found by ``dense_role``.
- ``declare_weight_decay(module, "alpha", True)``: an exception to the role's decay default.
- ``declare_optimizer_scale(module, "weight", lr=0.25, weight_decay=2.0, eps=0.5)``: multipliers of the
  recipe's learning rate, weight decay and Adam epsilon for one parameter (a parametrization declares them
  on every parameter by role; a plugin may declare its own); read by every optimizer builder. A
  parametrization also declares that a rule derived for Adam scales a parameter (``declare_adam_rule``) and, where
  it states one, the rule for Muon instead (``declare_muon_rule``): Muon applies the second or refuses.
- ``declare_unit_norm(module, "weight", dim)``: a weight kept on the unit sphere (nGPT's renormalisation).
- ``declare_diagnostic(module, "alpha", fn=None)``: a learned scalar worth watching (``diag/scalar/...``).
- ``declare_progress_hook(module, fn)``: a behaviour that follows the optimizer step (PRepBN, BHyT).

Every parameter of every registered plugin must have exactly one role (a test checks; torch's own
normalisation layers, which cannot declare, are known by type: their weight is a gain, their bias a bias).
Declarations live in one plain attribute per module (not a buffer, not a submodule): they survive FSDP and
compile wrapping, are not saved in checkpoints and cost nothing in the forward pass. Parameters are looked
up by name when asked, so a wrapper that swaps them (FSDP2's DTensors) is followed.

Pure PyTorch: nothing here knows about Lightning.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from arch_plugins.interfaces import Kind, Role

_ATTR = "arch_declarations"


def _declare(module: nn.Module, what: str, key: str, value: Any) -> None:
    """Record ``value`` under ``what``/``key`` on ``module`` (a later declaration of the same key replaces it)."""
    everything = dict(getattr(module, _ATTR, {}))
    entries = dict(everything.get(what, {}))
    entries[key] = value
    everything[what] = entries
    object.__setattr__(module, _ATTR, everything)  # a plain attribute: see the module docstring


def _declared(module: nn.Module, what: str) -> dict[str, Any]:
    return getattr(module, _ATTR, {}).get(what, {})


def _walk(model: nn.Module, what: str) -> Iterator[tuple[str, nn.Module, str, Any]]:
    """Every (module path, module, key, value) declared under ``what`` in ``model``, in module order."""
    for module_name, module in model.named_modules():
        for key, value in _declared(module, what).items():
            yield module_name, module, key, value


def _qualified(module_name: str, name: str) -> str:
    return f"{module_name}.{name}" if module_name else name


def _parameter(module: nn.Module, param_name: str, purpose: str) -> None:
    if not isinstance(getattr(module, param_name, None), nn.Parameter):
        raise ValueError(f"{type(module).__name__} has no parameter {param_name!r} to {purpose}")


# ---------------------------------------------------------------------------------------------------------
# Roles

# The kind of every built-in role: what optimizers (Muon takes hidden matrices) and parametrizations (muP's
# matrix-like vs vector-like rules) route on.
ROLE_KINDS: dict[str, str] = {
    Role.Q: Kind.HIDDEN, Role.K: Kind.HIDDEN, Role.V: Kind.HIDDEN, Role.ATTN_OUT: Kind.HIDDEN,
    Role.MLP_IN: Kind.HIDDEN, Role.MLP_GATE: Kind.HIDDEN, Role.MLP_OUT: Kind.HIDDEN, Role.FFN: Kind.HIDDEN,
    Role.EMBEDDING: Kind.EMBEDDING, Role.POSITION: Kind.EMBEDDING, Role.CLS_TOKEN: Kind.EMBEDDING,
    Role.HEAD: Kind.HEAD,
    Role.GAIN: Kind.VECTOR, Role.BIAS: Kind.VECTOR, Role.SCALAR: Kind.SCALAR,
}

# The per-layer group each built-in role is reported under by the diagnostics (``diag/grad_norm/layerNN.<group>``).
ROLE_GROUPS: dict[str, str] = {
    Role.Q: "qkv", Role.K: "qkv", Role.V: "qkv", Role.ATTN_OUT: "attn_out", Role.MLP_IN: "mlp_in",
    Role.MLP_GATE: "mlp_in", Role.MLP_OUT: "mlp_out", Role.FFN: "ffn",
    Role.GAIN: "norms", Role.BIAS: "norms", Role.SCALAR: "norms",
}

# Whether a kind decays by default (nanoGPT's rule: matrices and embeddings do, vectors and scalars do not).
KIND_DECAYS: dict[str, bool] = {Kind.HIDDEN: True, Kind.EMBEDDING: True, Kind.HEAD: True, Kind.READOUT: True,
                                Kind.VECTOR: False, Kind.SCALAR: False}

# How a parameter's own init scales with width (``declare_role(..., init=...)``): ``fixed``, a std that does not
# depend on width (the stack's ``init_std``, a constant, zero), which a width parametrization scales by its whole
# rule; ``fan_in``, a std already over sqrt(fan-in) (nn.Linear's default, Xavier), which is muP's hidden rule
# already, so only a readout's remaining 1/sqrt(fan-in ratio) is left to apply.
INITS = ("fixed", "fan_in")


@dataclass(frozen=True)
class RoleDeclaration:
    """What one parameter is. ``rows``: for a fused matrix, the logical matrices it holds, as (role, start, stop)
    along dim 0 (its output rows); a whole parameter has one row block."""

    role: str
    kind: str
    group: str
    rows: tuple[tuple[str, int, int], ...] | None = None
    fan_in_dim: int | None = None
    init: str = "fixed"


@dataclass(frozen=True)
class ParameterRole:
    """One trainable parameter with its role: ``parameter_roles``' answer.

    ``slices`` lists the logical matrices of a fused parameter as (role, start, stop) along dim 0, e.g. a q|k|v
    weight gives ``(("q", 0, d), ("k", d, 2d), ("v", 2d, 3d))``; None for a parameter that is one thing.
    ``role`` of a fused parameter joins its parts (``"q|k|v"``); they always share one ``kind``.
    ``fan_in_dim``: the dim its input is summed over (``fan_in_dim`` below), None for none (gains, scalars).
    ``init``: how its own init scales with width (``INITS``). ``fan_in_ratio``/``fan_out_ratio``: its fan-in
    and fan-out over those of its twin in the model built at the base shape (``width_ratios``); 1 where no base
    shape was given.
    """

    name: str
    param: nn.Parameter
    role: str
    kind: str
    group: str
    slices: tuple[tuple[str, int, int], ...] | None = None
    fan_in_dim: int | None = None
    init: str = "fixed"
    fan_in_ratio: float = 1.0
    fan_out_ratio: float = 1.0


class UndeclaredRoleError(ValueError):
    """A trainable parameter has no role (or two)."""


def declare_role(module: nn.Module, param_name: str, role: str | dict[str, tuple[int, int]], *,
                 kind: str | None = None, group: str | None = None, fan_in_dim: int | None = None,
                 init: str = "fixed") -> None:
    """Declare what ``module.<param_name>`` is.

    ``role``: a built-in role (``arch_plugins.interfaces.Role``), a plugin's own role name (then ``kind`` is
    required: one of ``arch_plugins.interfaces.Kind``), or, for a fused matrix, ``{role: (start, stop)}`` row
    slices of the weight (shape (d_out, d_in)) covering all its rows, all of one kind. ``group``: where the
    diagnostics report it per layer (default: the role's, e.g. ``qkv``, ``norms``; plugin roles: ``other``).
    ``fan_in_dim``: the dim the parameter's input is summed over, when it is not the default (dim 1 of a matrix
    stored as ``x @ W.T``, dim 0 of a readout vector): e.g. 0 for a (d, k) matrix used as ``x @ W``.
    ``init``: how the module's own init scales with width, ``fixed`` (default) or ``fan_in`` (``INITS``).
    """
    _parameter(module, param_name, "declare a role for")
    param = getattr(module, param_name)
    if init not in INITS:
        raise ValueError(f"init={init!r}: say how {type(module).__name__}.{param_name}'s init scales with width, "
                         f"one of {', '.join(INITS)}")
    if fan_in_dim is not None and not -param.dim() <= fan_in_dim < param.dim():
        raise ValueError(f"fan_in_dim={fan_in_dim} is no dim of {type(module).__name__}.{param_name} (shape "
                         f"{tuple(param.shape)}); give the dim its input is summed over")
    if isinstance(role, dict):
        if not role:
            raise ValueError("declare_role needs at least one row slice")
        rows = tuple(sorted(((r, int(a), int(b)) for r, (a, b) in role.items()), key=lambda part: part[1]))
        if rows[0][1] != 0 or rows[-1][2] != param.shape[0] or any(
                prev[2] != nxt[1] for prev, nxt in zip(rows, rows[1:], strict=False)):
            raise ValueError(f"the row slices {dict(role)} of {type(module).__name__}.{param_name} must tile its "
                             f"{param.shape[0]} rows without gap or overlap")
        kinds = {_kind(r, kind) for r, _, _ in rows}
        if len(kinds) > 1:
            raise ValueError(f"the parts of a fused parameter must share one kind, got {sorted(kinds)}")
        names = [r for r, _, _ in rows]
        declaration = RoleDeclaration("|".join(names), kinds.pop(), group or ROLE_GROUPS.get(names[0], "other"),
                                      rows if len(rows) > 1 else None, fan_in_dim, init)
    else:
        declaration = RoleDeclaration(role, _kind(role, kind), group or ROLE_GROUPS.get(role, "other"),
                                      None, fan_in_dim, init)
    _declare(module, "role", param_name, declaration)


def _kind(role: str, kind: str | None) -> str:
    if kind is None:
        if role not in ROLE_KINDS:
            raise ValueError(f"role {role!r} is not built in ({', '.join(ROLE_KINDS)}); a plugin's own role "
                             f"says its kind: declare_role(module, name, {role!r}, kind=Kind.VECTOR) "
                             f"(one of {', '.join(Kind.ALL)})")
        return ROLE_KINDS[role]
    if kind not in Kind.ALL:
        raise ValueError(f"unknown kind {kind!r}; use one of {', '.join(Kind.ALL)}")
    return kind


def declare_roles(module: nn.Module, roles: dict[str, str], **options: Any) -> None:
    """``declare_role`` for several parameters of one module: ``{param_name: role}`` (same ``kind``/``group``).

    Names that are not parameters of the module now (a bias switched off, a table kept as a fixed buffer) are
    skipped, so a module declares its optional parameters in one line; the every-plugin test catches a typo.
    """
    for param_name, role in roles.items():
        if isinstance(getattr(module, param_name, None), nn.Parameter):
            declare_role(module, param_name, role, **options)


# Torch's own normalisation layers cannot declare: known by type, their affine weight is a gain, their bias a bias.
_TORCH_NORMS = (nn.LayerNorm, nn.RMSNorm, nn.GroupNorm, nn.modules.batchnorm._NormBase)


def _role_of(module: nn.Module, param_name: str) -> RoleDeclaration | None:
    declared = _declared(module, "role").get(param_name)
    if declared is None and isinstance(module, _TORCH_NORMS) and param_name in ("weight", "bias"):
        role = Role.GAIN if param_name == "weight" else Role.BIAS
        return RoleDeclaration(role, ROLE_KINDS[role], ROLE_GROUPS[role])
    return declared


def role_declarations(model: nn.Module) -> dict[int, tuple[str, RoleDeclaration]]:
    """``{id(parameter): (qualified name, declaration)}``; a parameter declared as two different things is an error."""
    found: dict[int, tuple[str, RoleDeclaration]] = {}
    for module_name, module in model.named_modules():
        for param_name, param in module.named_parameters(recurse=False):
            declaration = _role_of(module, param_name)
            if declaration is None:
                continue
            name = _qualified(module_name, param_name)
            if id(param) in found and found[id(param)][1] != declaration:
                raise UndeclaredRoleError(
                    f"{name} is declared as {declaration.role!r} and, as {found[id(param)][0]}, as "
                    f"{found[id(param)][1].role!r}: a (tied) parameter has exactly one role; declare it once")
            found.setdefault(id(param), (name, declaration))
    return found


def parameter_roles(model: nn.Module, *, strict: bool = True) -> list[ParameterRole]:
    """Every trainable parameter of ``model`` once (tied ones once), in ``model.named_parameters()`` order,
    with its role.

    ``strict``: an undeclared parameter is an error that says how to declare it; otherwise it is returned with
    role ``undeclared`` and the kind its shape suggests (for third-party plugins that predate roles).
    """
    declared = role_declarations(model)
    result = []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if id(param) in declared:
            d = declared[id(param)][1]
            result.append(ParameterRole(name, param, d.role, d.kind, d.group, d.rows,
                                        fan_in_dim(d.kind, param.dim(), d.fan_in_dim), d.init))
        elif strict:
            module, _, attr = name.rpartition(".")
            raise UndeclaredRoleError(
                f"parameter {name} (shape {tuple(param.shape)}) has no role: the module that owns it declares one "
                f"where it is built, e.g. declare_role(self, {attr!r}, Role.GAIN) or, for a plugin's own "
                f"parameter, declare_role(self, {attr!r}, 'my_role', kind=Kind.VECTOR) "
                f"(arch_plugins.declarations; see docs/plugins/declarations.md)")
        else:
            kind = Kind.HIDDEN if param.dim() >= 2 else Kind.VECTOR
            result.append(ParameterRole(name, param, UNDECLARED, kind, "other", None, fan_in_dim(kind, param.dim())))
    return result


UNDECLARED = "undeclared"


def fan_in_dim(kind: str, ndim: int, declared: int | None = None) -> int | None:
    """The dim a parameter's input is summed over: the declared one, else dim 1 of a matrix (torch's (out, in)
    layout, conv weights included; dim 0 of an embedding table, whose rows are looked up), dim 0 of a readout
    vector (``w . x``), none for a gain, bias or scalar (its width, if any, is its fan-out)."""
    if declared is not None:
        return declared % ndim
    if ndim == 0 or (ndim == 1 and kind != Kind.READOUT):
        return None
    if ndim == 1 or (kind == Kind.EMBEDDING and ndim == 2):
        return 0
    return 1


def fan_ratios(shape: tuple[int, ...], base: tuple[int, ...], fan_in: int | None) -> tuple[float, float]:
    """(fan-in ratio, fan-out ratio) of a parameter of ``shape`` against its twin of shape ``base`` in the model
    built at the base shape: the growth of the dim its input is summed over, and of all the others together."""
    if len(shape) != len(base):
        raise ValueError(f"a parameter of shape {tuple(shape)} has a twin of shape {tuple(base)} at the base shape: "
                         f"a base shape changes sizes, never the number of dims")
    ratios = [s / b for s, b in zip(shape, base, strict=True)]
    r_in = ratios[fan_in] if fan_in is not None else 1.0
    r_out = math.prod(r for i, r in enumerate(ratios) if i != fan_in)
    return r_in, r_out


def width_ratios(model: nn.Module, base: nn.Module, roles: list[ParameterRole]) -> dict[int, tuple[float, float]]:
    """``{id(parameter): (fan-in ratio, fan-out ratio)}`` for every parameter in ``roles`` that ``base`` (the same
    module built at the base shape, e.g. on the meta device) holds under the same name; others are left out."""
    names = {id(p): n for n, p in model.named_parameters()}
    twins = dict(base.named_parameters())
    out = {}
    for p in roles:
        twin = twins.get(names.get(id(p.param), ""))
        if twin is not None:
            out[id(p.param)] = fan_ratios(tuple(p.param.shape), tuple(twin.shape), p.fan_in_dim)
    return out


def role_table(model: nn.Module, *, strict: bool = False) -> list[dict[str, Any]]:
    """One row per role: role, kind, how many parameter tensors and how many numbers (fused parts counted
    by their slices), and whether it decays by default. For logging at the start of a run."""
    decay = decays(model)
    rows: dict[str, dict[str, Any]] = {}
    for p in parameter_roles(model, strict=strict):
        # Shapes only (an FSDP2 DTensor reports its global shape): nothing here reads values or starts collectives.
        numel, first = p.param.numel(), (p.param.shape[0] if p.param.dim() else 1)
        for role, start, stop in p.slices or ((p.role, 0, first),):
            row = rows.setdefault(role, {"role": role, "kind": p.kind, "tensors": 0, "parameters": 0,
                                         "decay": decay[id(p.param)]})
            row["tensors"] += 1
            row["parameters"] += numel // first * (stop - start)
    return sorted(rows.values(), key=lambda r: (list(Kind.ALL).index(r["kind"]), r["role"]))


def format_role_table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'role':<24} {'kind':<10} {'tensors':>7} {'parameters':>12}  decay"]
    lines += [f"{r['role']:<24} {r['kind']:<10} {r['tensors']:>7} {r['parameters']:>12,}  {r['decay']}"
              for r in rows]
    return "\n".join(lines)


def declare_dense_rows(module: nn.Module, rows: dict[str, tuple[int, int]]) -> None:
    """Declare that rows ``start:stop`` of ``module.weight`` (shape (d_out, d_in)) compute role ``role``:
    ``declare_role(module, "weight", rows)``."""
    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise ValueError(f"{type(module).__name__} has no 2-D weight whose rows could play roles")
    declare_role(module, "weight", rows)


def dense_role(within: nn.Module, role: str) -> tuple[nn.Module, int, int] | None:
    """The (module, start, stop) inside ``within`` whose ``weight`` rows ``start:stop`` compute ``role``, or None.

    Only weights that really are ``x @ W.T`` declare built-in projection roles on ``weight`` (a Pattention's
    parameter tokens have roles of their own), so a component that needs a matrix finds none there. The module
    is returned rather than the tensor: wrappers that swap parameters (FSDP2) are followed when it is read.
    """
    for module in within.modules():
        declared = _declared(module, "role").get("weight")
        if declared is None:
            continue
        for part, start, stop in declared.rows or ((declared.role, 0, module.weight.shape[0]),):
            if part == role:
                return module, start, stop
    return None


def dense_weight(found: tuple[nn.Module, int, int]) -> torch.Tensor:
    """The rows of a ``dense_role`` result, as the module holds them now."""
    module, start, stop = found
    return module.weight[start:stop]


# ---------------------------------------------------------------------------------------------------------
# Weight decay


def declare_weight_decay(module: nn.Module, param_name: str, decay: bool) -> None:
    """Declare that ``module.<param_name>`` decays (``True``) or not (``False``), whatever its role's default."""
    _parameter(module, param_name, "declare weight decay for")
    if not isinstance(decay, bool):
        raise TypeError(f"decay must be True or False, got {decay!r}")
    _declare(module, "weight_decay", param_name, decay)


def declared_weight_decay(model: nn.Module) -> Iterator[tuple[nn.Parameter, bool]]:
    """Every declared (parameter, decay) of ``model``, in module order."""
    for _, module, param_name, decay in _walk(model, "weight_decay"):
        yield getattr(module, param_name), decay


def decays(model: nn.Module) -> dict[int, bool]:
    """Whether each parameter of ``model`` decays, by ``id``: its declaration, else its role's kind (hidden
    matrices, embeddings and heads decay; vectors and scalars do not), else (no role) ``ndim >= 2``.

    A parameter declared twice with different answers (a tied weight whose two owners disagree) is an error.
    """
    roles = role_declarations(model)
    result = {id(p): KIND_DECAYS[roles[id(p)][1].kind] if id(p) in roles else p.dim() >= 2
              for p in model.parameters()}
    declared: dict[int, bool] = {}
    for param, decay in declared_weight_decay(model):
        if declared.setdefault(id(param), decay) != decay:
            raise ValueError("a parameter is declared both to decay and not to decay (tied weights disagree)")
        result[id(param)] = decay
    return result


# ---------------------------------------------------------------------------------------------------------
# Optimizer scales


@dataclass(frozen=True)
class OptimizerScale:
    """Multipliers of the recipe's learning rate, weight decay and Adam epsilon for one parameter.

    The contract with every optimizer builder: a parameter updated by an Adam-family rule uses
    ``lr * scale.lr``, ``weight_decay * scale.weight_decay`` (as PyTorch's AdamW applies it: the step shrinks
    the weight by ``lr * weight_decay``) and ``eps * scale.eps``. The multipliers of a parametrization are
    derived for Adam; an optimizer that updates a parameter by another rule (Muon's orthogonalised step) must
    not apply them silently: it applies its own stated rule or refuses (``is_default`` tells it whether
    anything was declared).
    """

    lr: float = 1.0
    weight_decay: float = 1.0
    eps: float = 1.0

    def __post_init__(self):
        for name in ("lr", "weight_decay", "eps"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and value >= 0 and value == value and value != float("inf")):
                raise ValueError(f"an optimizer scale's {name} multiplier must be a finite number >= 0, got {value!r}")
        if self.lr == 0 or self.eps == 0:
            raise ValueError("an optimizer scale's lr and eps multipliers must be > 0 (freeze a parameter with "
                             "requires_grad=False instead)")

    @property
    def is_default(self) -> bool:
        return self == DEFAULT_SCALE

    def __mul__(self, other: OptimizerScale) -> OptimizerScale:
        return OptimizerScale(self.lr * other.lr, self.weight_decay * other.weight_decay, self.eps * other.eps)


DEFAULT_SCALE = OptimizerScale()


def declare_optimizer_scale(module: nn.Module, param_name: str, scale: OptimizerScale | None = None, *,
                            lr: float = 1.0, weight_decay: float = 1.0, eps: float = 1.0) -> None:
    """Declare multipliers of the recipe's lr, weight decay and Adam epsilon for ``module.<param_name>``.

    Declarations compose by multiplication (a plugin's own multiplier and a parametrization's both apply).
    """
    _parameter(module, param_name, "declare an optimizer scale for")
    scale = (scale or DEFAULT_SCALE) * OptimizerScale(lr, weight_decay, eps)
    earlier = _declared(module, "optimizer_scale").get(param_name, DEFAULT_SCALE)
    _declare(module, "optimizer_scale", param_name, earlier * scale)


def optimizer_scales(model: nn.Module) -> dict[int, OptimizerScale]:
    """The declared ``OptimizerScale`` of every parameter of ``model``, by ``id`` (default: all 1).

    A tied parameter declared by two owners with different scales is an error (it has one update rule).
    """
    result = {id(p): DEFAULT_SCALE for p in model.parameters()}
    seen: dict[int, OptimizerScale] = {}
    for module_name, module, param_name, scale in _walk(model, "optimizer_scale"):
        param = getattr(module, param_name)
        if seen.setdefault(id(param), scale) != scale:
            raise ValueError(f"{_qualified(module_name, param_name)} is declared with two optimizer scales "
                             f"({seen[id(param)]} and {scale}): tied weights must agree")
        result[id(param)] = scale
    return result


def declare_adam_rule(module: nn.Module, param_name: str, source: str) -> None:
    """Declare that ``source`` (a parametrization) scales ``module.<param_name>`` by a rule derived for Adam, at
    every shape, including the base shape where its multipliers are all 1. An optimizer that steps the parameter
    by another rule (Muon) decides from this, not from the numbers, so a ladder cannot pass at the base width and
    fail at the next."""
    _parameter(module, param_name, "declare an Adam-derived rule for")
    _declare(module, "adam_rule", param_name, source)


def adam_rules(model: nn.Module) -> dict[int, str]:
    """``{id(parameter): source}`` for every parameter a parametrization scales by an Adam-derived rule."""
    return {id(getattr(module, name)): source for _, module, name, source in _walk(model, "adam_rule")}


@dataclass(frozen=True)
class MuonRule:
    """A parametrization's rule for a matrix that Muon steps instead of Adam (muP's spectral rule).

    Muon multiplies its learning rate and weight decay by ``muon`` (in place of ``adam``, the Adam-derived scale
    the same parametrization declared for the parameter, which Muon then does not apply) and scales each
    (logical) matrix's orthogonalised step by ``adjust_lr``'s factor of its shape (``spectral``:
    sqrt(fan_out / fan_in)).
    """

    source: str
    muon: OptimizerScale
    adam: OptimizerScale
    adjust_lr: str = "spectral"


def declare_muon_rule(module: nn.Module, param_name: str, rule: MuonRule) -> None:
    """Declare the rule by which ``rule.source`` scales ``module.<param_name>`` when Muon steps it. A parameter with
    an Adam-derived rule (``declare_adam_rule``) and no Muon rule is refused by Muon."""
    _parameter(module, param_name, "declare a Muon rule for")
    _declare(module, "muon_rule", param_name, rule)


def muon_rules(model: nn.Module) -> dict[int, MuonRule]:
    """``{id(parameter): rule}`` for every parameter a parametrization declared a Muon rule for."""
    return {id(getattr(module, name)): rule for _, module, name, rule in _walk(model, "muon_rule")}


# ---------------------------------------------------------------------------------------------------------
# Unit-norm constraints


def declare_unit_norm(module: nn.Module, param_name: str, dim: int) -> None:
    """Declare that ``module.<param_name>`` must keep unit L2 norm along ``dim`` (renormalised after each step)."""
    if not isinstance(getattr(module, param_name, None), nn.Parameter):
        raise ValueError(f"{type(module).__name__} has no parameter {param_name!r} to constrain")
    _declare(module, "unit_norm", param_name, dim)


def unit_norm_parameters(model: nn.Module) -> Iterator[tuple[str, nn.Parameter, int]]:
    """Every declared (qualified name, parameter, dim), each parameter once (tied weights share one)."""
    seen: set[int] = set()
    for module_name, module, param_name, dim in _walk(model, "unit_norm"):
        param = getattr(module, param_name)
        if id(param) in seen:
            continue
        seen.add(id(param))
        yield _qualified(module_name, param_name), param, dim


# ---------------------------------------------------------------------------------------------------------
# Diagnostic scalars

ScalarFn = Callable[[nn.Module], torch.Tensor]


def declare_diagnostic(module: nn.Module, name: str, fn: ScalarFn | None = None) -> None:
    """Declare that ``fn(module)`` (default: the parameter or buffer ``module.<name>``) is worth recording as ``name``.

    ``fn`` receives the module (not a closure over it, so no reference cycle is made and a module-level
    function or ``functools.partial`` keeps the model picklable). It is called under ``torch.no_grad``,
    at most every few steps; under FSDP2 the parameters it reads are DTensor shards, and plain tensor
    operations on them give the global value (the caller gathers the result). A value with several elements
    is reported as its mean.
    """
    if not name or "/" in name:
        raise ValueError(f"a diagnostic name must be a non-empty metric name without '/', got {name!r}")
    if fn is None:
        if not isinstance(getattr(module, name, None), torch.Tensor):
            raise ValueError(f"{type(module).__name__} has no tensor {name!r} to record; pass fn")
        fn = operator.attrgetter(name)
    _declare(module, "diagnostic", name, fn)


def declared_diagnostics(model: nn.Module) -> Iterator[tuple[str, nn.Module, ScalarFn]]:
    """Every declared (``<module path>.<name>``, module, fn) of ``model``, in module order."""
    for module_name, module, name, fn in _walk(model, "diagnostic"):
        yield _qualified(module_name, name), module, fn


def has_diagnostics(model: nn.Module) -> bool:
    return next(declared_diagnostics(model), None) is not None


# ---------------------------------------------------------------------------------------------------------
# Where a site's normalised representation is read


def declare_norm_output(module: nn.Module) -> None:
    """Declare that ``module``'s output is its site's normalised representation, for a site module that does more
    after its norm (OSP's final site: the norm, then a projection). The outlier probes read the final state there,
    as a Hugging Face model's last hidden state is its final norm's output; without a declaration they read the
    site module's own output."""
    _declare(module, "norm_output", "here", True)


def norm_output(site_module: nn.Module) -> nn.Module:
    """The module whose output is ``site_module``'s normalised representation: the first declared one inside it,
    else ``site_module`` itself."""
    return next((m for _, m, _, _ in _walk(site_module, "norm_output")), site_module)


# ---------------------------------------------------------------------------------------------------------
# Training-progress hooks


@dataclass(frozen=True)
class TrainingProgress:
    """Where training stands when the hooks are called.

    ``step``: optimizer steps taken so far (0 before the first); ``total_steps``: optimizer steps the run
    will take, None when the loop does not know (an epoch-bounded run over an iterable of unknown length).
    """

    step: int
    total_steps: int | None = None

    def fraction(self) -> float | None:
        return None if not self.total_steps else min(1.0, self.step / self.total_steps)


ProgressHook = Callable[[nn.Module, TrainingProgress], None]


def declare_progress_hook(module: nn.Module, fn: ProgressHook) -> None:
    """Declare that ``fn(module, progress)`` must run once per optimizer step, before its forward pass.

    ``fn`` receives the module (not a closure over it, so no reference cycle is made and the model stays
    picklable). One hook per module: a later declaration replaces an earlier one. A hook depends only on
    ``progress`` (a resumed run calls it at the step it resumes from) and starts no collectives.
    """
    _declare(module, "progress", "hook", fn)


def progress_hooks(model: nn.Module) -> Iterator[tuple[str, nn.Module, ProgressHook]]:
    """Every declared (module path, module, hook) of ``model``, in module order."""
    for module_name, module, _, fn in _walk(model, "progress"):
        yield module_name, module, fn


def has_progress_hooks(model: nn.Module) -> bool:
    return next(progress_hooks(model), None) is not None
