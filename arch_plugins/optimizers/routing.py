"""Per-parameter settings from declared roles: learning-rate and weight-decay multipliers, and param groups.

A recipe writes multipliers keyed by a role (``embedding``, ``head``, ``q``, a plugin's own role) or by a kind
(``hidden``, ``embedding``, ``head``, ``vector``, ``scalar``; ``arch_plugins.interfaces.Kind``); a role's entry
wins over its kind's::

    lr_multipliers: {embedding: 0.3, head: 0.003125, vector: 0.01, scalar: 0.01}

A parametrization (muP and the like) multiplies in its own per-parameter factors: the learning-rate, weight-decay
and Adam-epsilon multipliers it declares on each parameter (``declare_optimizer_scale``, read by
``optimizer_scales``). Parameters with the same settings share one param group, in the order the model holds
them, decaying groups first (the order the optimizer always had), so that the default settings give exactly the
groups they always gave.

Pure PyTorch: nothing here knows about Lightning.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from arch_plugins.declarations import (
    DEFAULT_SCALE,
    OptimizerScale,
    ParameterRole,
    decays,
    optimizer_scales,
    parameter_roles,
)
from arch_plugins.interfaces import Kind
from arch_plugins.registry import PluginError


def check_multipliers(name: str, multipliers: dict[str, float] | None) -> dict[str, float]:
    """The multipliers as floats, or a one-line error for a value that is not a positive number."""
    checked = {}
    for key, value in (multipliers or {}).items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise PluginError(f"{name}[{key!r}] must be a number >= 0, got {value!r}")
        checked[str(key)] = float(value)
    return checked


def check_betas(role_betas: dict[str, Any] | None) -> dict[str, tuple[float, float]]:
    """Per-role Adam betas as (beta1, beta2) pairs, or a one-line error."""
    checked = {}
    for key, value in (role_betas or {}).items():
        pair = tuple(value) if isinstance(value, (list, tuple)) else ()
        if len(pair) != 2 or not all(isinstance(b, (int, float)) and 0 <= b < 1 for b in pair):
            raise PluginError(f"role_betas[{key!r}] must be two numbers in [0, 1), e.g. [0.8, 0.95], got {value!r}")
        checked[str(key)] = (float(pair[0]), float(pair[1]))
    return checked


def lookup(table: dict[str, Any], p: ParameterRole, default: Any) -> Any:
    """The entry of parameter ``p``: its role's, else its kind's, else ``default``. A fused parameter's parts
    (``q|k|v``) must agree, since one tensor has one setting in an element-wise optimizer."""
    parts = [role for role, _, _ in p.slices] if p.slices else [p.role]
    found = {table.get(p.role, table.get(role, table.get(p.kind, default))) for role in parts}
    if len(found) > 1:
        raise PluginError(f"{p.name} holds {p.role} in one tensor, which has one learning rate; give its parts "
                          f"one setting (e.g. {p.role!r}: x or {p.kind!r}: x), got {sorted(found)}")
    return found.pop()


def own_betas(role_betas: dict[str, tuple[float, float]], p: ParameterRole) -> dict[str, tuple[float, float]]:
    """``{"betas": ...}`` for a parameter whose role or kind has its own betas, else nothing (the optimizer's)."""
    betas = lookup(role_betas, p, None)
    return {} if betas is None else {"betas": betas}


def own_eps(eps: float, declared: OptimizerScale) -> dict[str, float]:
    """``{"eps": ...}`` for a parameter whose declared scale changes Adam's epsilon (CompleteP), else nothing."""
    return {} if declared.eps == 1.0 else {"eps": eps * declared.eps}


def multiplier(multipliers: dict[str, float], p: ParameterRole) -> float:
    """The multiplier of parameter ``p``: its role's, else its kind's, else 1."""
    return lookup(multipliers, p, 1.0)


def unknown_keys(multipliers: dict[str, float], roles: list[ParameterRole]) -> list[str]:
    """Keys that match no role or kind of this model (a typo would otherwise silently do nothing)."""
    known = set(Kind.ALL)
    for p in roles:
        known |= {p.role} | {role for role, _, _ in p.slices or ()}
    return sorted(set(multipliers) - known)


def settings(model: nn.Module, roles: list[ParameterRole], *, lr_multipliers: dict[str, float],
             wd_multipliers: dict[str, float], role_betas: dict[str, tuple[float, float]] | None = None
             ) -> list[tuple[ParameterRole, float, float, OptimizerScale]]:
    """(parameter, lr multiplier, weight-decay multiplier, declared scale) for every trainable parameter; the
    weight-decay multiplier is 0 for parameters that do not decay (``arch_plugins.declarations.decays``). Both
    multipliers include the parameter's declared ``OptimizerScale``, returned too: its ``eps`` multiplies Adam's
    epsilon, and an optimizer that does not step the parameter as Adam does must see whether one was declared."""
    for option, given in (("lr_multipliers", lr_multipliers), ("wd_multipliers", wd_multipliers),
                          ("role_betas", role_betas or {})):
        unknown = unknown_keys(given, roles)
        if unknown:
            raise PluginError(f"{option} names {', '.join(map(repr, unknown))}, which is no role or kind of this "
                              f"model; its roles are listed in the run's role table, its kinds are "
                              f"{', '.join(Kind.ALL)}")
    decay, declared = decays(model), optimizer_scales(model)
    out = []
    for p in roles:
        own = declared.get(id(p.param), DEFAULT_SCALE)
        lr_mult = multiplier(lr_multipliers, p) * own.lr
        wd_mult = multiplier(wd_multipliers, p) * own.weight_decay
        out.append((p, lr_mult, wd_mult if decay[id(p.param)] else 0.0, own))
    return out


def param_groups(entries: list[tuple[Any, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Group ``(parameter, group settings)`` pairs with equal settings, in first-seen order, decaying groups first."""
    groups: dict[tuple, dict[str, Any]] = {}
    for param, options in entries:
        key = tuple(sorted(options.items(), key=lambda kv: kv[0]))
        groups.setdefault(key, {**options, "params": []})["params"].append(param)
    ordered = list(groups.values())
    return sorted(ordered, key=lambda g: g.get("weight_decay", 0.0) == 0.0)  # stable: decaying groups first


def optimizer_settings(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, dict[str, Any]]:
    """Per role: which algorithm steps it (``muon`` or the optimizer's class), its lr over the task's lr and its
    weight decay, as built; a role whose parameters differ (a parametrization scaling by depth) lists each value."""
    groups = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    found: dict[str, dict[str, set]] = {}
    for p in parameter_roles(model, strict=False):
        group = groups.get(id(p.param))
        if group is None:
            continue
        algorithm = ("muon" if group.get("muon") else "adamw" if isinstance(optimizer, torch.optim.AdamW)
                     else type(optimizer).__name__)
        for role in [r for r, _, _ in p.slices] if p.slices else [p.role]:
            entry = found.setdefault(role, {"optimizer": set(), "lr_ratio": set(), "weight_decay": set()})
            entry["optimizer"] |= {algorithm}
            entry["lr_ratio"] |= {float(group.get("lr_ratio", 1.0))}
            entry["weight_decay"] |= {float(group["weight_decay"])}
    return {role: {k: (sorted(v)[0] if len(v) == 1 else sorted(v)) for k, v in entry.items()}
            for role, entry in found.items()}
