"""The dense linear projection."""

from __future__ import annotations

from typing import Literal

from torch import nn

from arch_plugins.declarations import ROLE_GROUPS, Role, declare_role, declare_unit_norm
from arch_plugins.interfaces import ProjectionType, StackInfo


class Linear(nn.Linear):
    """nn.Linear with normal init and the unit-norm declaration protocol."""

    def __init__(self, d_in: int, d_out: int, *, bias: bool, init_std: float):
        super().__init__(d_in, d_out, bias=bias)
        nn.init.normal_(self.weight, std=init_std)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def constrain_unit_norm(self, axis: Literal["in", "out"]) -> None:
        # weight is (d_out, d_in): the "in" side is normalised per row (dim 1), "out" per column (dim 0).
        declare_unit_norm(self, "weight", 1 if axis == "in" else 0)


class LinearProjection(ProjectionType):
    """Dense matrix multiply (nn.Linear); q|k|v and value|gate are fused into one matmul."""

    def linear(self, d_in: int, d_out: int, role: str, layer: int, stack: StackInfo, *, bias: bool,
               init_std: float) -> Linear:
        module = Linear(d_in, d_out, bias=bias, init_std=init_std)
        _declare_roles(module, {role: (0, d_out)})
        return module

    def fused(self, d_in: int, d_outs: list[int], roles: list[str], layer: int, stack: StackInfo, *,
              bias: bool, init_std: float) -> Linear:
        # Row blocks of one matrix are exactly separate projections (same init, same row constraints).
        module = Linear(d_in, sum(d_outs), bias=bias, init_std=init_std)
        starts = [sum(d_outs[:i]) for i in range(len(d_outs))]
        _declare_roles(module, {r: (s, s + d) for r, s, d in zip(roles, starts, d_outs, strict=True)})
        return module


def _declare_roles(module: Linear, rows: dict[str, tuple[int, int]]) -> None:
    """The weight's rows by role (a fused matrix keeps its logical matrices apart); the bias counts with them."""
    declare_role(module, "weight", rows)
    if module.bias is not None:
        declare_role(module, "bias", Role.BIAS, group=ROLE_GROUPS.get(next(iter(rows)), "other"))
