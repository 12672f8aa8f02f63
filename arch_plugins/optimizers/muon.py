"""Muon for hidden matrices, AdamW for everything else, routed by declared role; fused matrices split per part.

Muon (Keller Jordan, 2024; ``torch.optim.Muon``) replaces each hidden matrix's momentum by its nearest
semi-orthogonal matrix (five quintic Newton-Schulz steps in bf16) before the step. Only matrices whose both
dimensions grow with width qualify: an embedding or a head is 2-D too but must stay on AdamW (the shape alone
cannot tell them apart, and misrouting them degrades training silently), and so do vectors and scalars.

The update of one matrix is ``torch.optim.Muon``'s, computed with the same Newton-Schulz routine (kept in
``newton_schulz.py``, as torch's is private to recent releases): momentum in
lerp form (Nesterov by default), decoupled weight decay ``p *= 1 - lr * wd`` at the unadjusted learning rate,
and the step ``-adjusted_lr * orthogonalised(update)``. A fused matrix (q|k|v, value|gate) is orthogonalised
per logical matrix, each with its own shape's adjustment, as if the parts were separate parameters:
orthogonalising the block as one matrix is a different (and worse) optimizer.

Learning-rate adjustment rules (``adjust_lr``), with A x B the (rows, columns) of the matrix:

- ``original``: sqrt(max(1, A / B)) (KellerJordan/Muon, modded-nanogpt, ``torch.optim.Muon``'s default);
- ``match_rms_adamw``: 0.2 * sqrt(max(A, B)) (Moonlight): the update's RMS matches AdamW's, so Muon can share
  AdamW's learning rate and weight decay;
- ``spectral``: sqrt(A / B) (Bernstein's spectral scaling; dion, torch's ``spectral_unclamped``).

Under muP (``mup``) the parametrization declares a rule for Muon on every hidden matrix it would scale for Adam
(``declare_muon_rule``): no 1/m_d on Muon's lr or weight decay, and the ``spectral`` adjustment sqrt(A / B), so
the step's spectral norm is lr * sqrt(fan_out / fan_in) at every width. A parametrization that declares an
Adam-derived rule and no Muon rule (``mup_wd``, ``completep``) is refused at build time, at every width.

The step is batched (``shape_groups.py``): one foreach call per group for the momentum, the weight decay and the
step, and one batched Newton-Schulz call per shape of logical matrix (a tall one joins its transpose's shape): its
~25 operator calls are paid per shape, not per matrix (a matrix still costs a few views). The updates equal the
per-matrix ones within bf16 rounding (``tests/test_muon_batched.py``).

Distributed: under data parallelism (DDP) every process holds the whole, all-reduced gradient. Under FSDP2 a
process holds a row shard of each matrix (a DTensor) and Newton-Schulz needs the whole matrix: each process keeps
its shard of the momentum and all-gathers the whole update of a matrix. In both cases each process then
orthogonalises its share of every shape group and one all-gather per group brings it the others' (bf16, the same
bits on every process, so the processes cannot drift apart); it applies its own rows. N processes equal one.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from arch_plugins.declarations import (
    ParameterRole,
    UndeclaredRoleError,
    adam_rules,
    decays,
    muon_rules,
    parameter_roles,
)
from arch_plugins.interfaces import Kind, OptimizerType
from arch_plugins.optimizers.routing import (
    check_betas,
    check_multipliers,
    multiplier,
    own_betas,
    own_eps,
    param_groups,
    settings,
)
from arch_plugins.optimizers.shape_groups import orthogonalize_by_shape
from arch_plugins.registry import PluginError

ADJUST_LR = {
    "original": lambda rows, cols: math.sqrt(max(1.0, rows / cols)),
    "match_rms_adamw": lambda rows, cols: 0.2 * math.sqrt(max(rows, cols)),
    "spectral": lambda rows, cols: math.sqrt(rows / cols),
}


def is_sharded(param: torch.Tensor) -> bool:
    """Whether ``param`` is a DTensor split across processes (FSDP2, tensor parallelism)."""
    placements = getattr(param, "placements", None)
    return placements is not None and any(not p.is_replicate() for p in placements)


def unsupported_placements(param: torch.Tensor) -> list[str]:
    """The placements of a DTensor ``param`` whose local part is not one box of the whole (strided or partial
    shards): Muon could not cut its own rows out of the whole update."""
    from torch.distributed.tensor import Replicate, Shard

    return [str(p) for p in getattr(param, "placements", ()) if type(p) not in (Shard, Replicate)]


def local_box(param: torch.Tensor) -> tuple[slice, slice]:
    """The (rows, columns) of the whole matrix that this process holds of the DTensor ``param``."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    return slice(offset[0], offset[0] + shape[0]), slice(offset[1], offset[1] + shape[1])


class MuonWithAdamW(torch.optim.AdamW):
    """One optimizer: param groups with ``muon: True`` step by Muon, the others by AdamW.

    One object (not two optimizers) so that Lightning's automatic optimization, the checkpoint and the
    learning-rate schedule see one optimizer with all its groups. A Muon group carries ``momentum``,
    ``nesterov``, ``ns_steps``, ``adjust_lr`` and, per parameter, the row slices of its logical matrices
    (``slices``: one list per parameter, each ``(start, stop)``).
    """

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        everything = self.param_groups
        try:  # AdamW's own step, over the AdamW groups only
            self.param_groups = [g for g in everything if not g.get("muon", False)]
            super().step()
        finally:
            self.param_groups = everything
        if muon_groups := [g for g in everything if g.get("muon", False)]:
            self._muon_step(muon_groups)
        return loss

    def _muon_step(self, groups: list[dict]) -> None:
        """Every Muon group's momentum (one foreach call per group), then all their logical matrices orthogonalised
        together by shape (``shape_groups``: one batched Newton-Schulz per shape, shared among processes), then each
        group's weight decay (one foreach call) and steps (one foreach call per learning rate)."""
        stepped, matrices, steps = [], [], []
        for group in groups:
            params = [(p, s) for p, s in zip(group["params"], group["slices"], strict=True) if p.grad is not None]
            if not params:
                continue
            for (param, slices), update in zip(params, self._momentum(group, [p for p, _ in params]), strict=True):
                whole = whole_tensor(update, param) if is_sharded(param) else update
                matrices += [whole if (start, stop) == (0, len(whole)) else whole[start:stop] for start, stop in slices]
                steps += [group["ns_steps"]] * len(slices)
            stepped.append((group, params))
        orthogonal = iter(orthogonalize_by_shape(matrices, steps))
        for group, params in stepped:
            lr, adjust = group["lr"], ADJUST_LR[group["adjust_lr"]]
            torch._foreach_mul_([local(p) for p, _ in params], 1 - lr * group["weight_decay"])
            steps_by_rate: dict[float, tuple[list, list]] = {}  # one foreach add per distinct scaled learning rate
            for param, slices in params:
                for start, stop in slices:
                    for target, part in own_rows(param, start, stop, next(orthogonal)):
                        targets, parts = steps_by_rate.setdefault(-lr * adjust(stop - start, param.shape[1]), ([], []))
                        targets.append(target)
                        parts.append(part)
            for rate, (targets, parts) in steps_by_rate.items():
                torch._foreach_add_(targets, parts, alpha=rate)

    def _momentum(self, group: dict, params: list[torch.Tensor]) -> list[torch.Tensor]:
        """The momentum buffers of ``params`` updated in place (lerp form) and their updates (Nesterov by default),
        on each process's own shards: momentum is element-wise."""
        momentum, buffers, counts = group["momentum"], [], []
        for param in params:
            state = self.state[param]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(param.grad, memory_format=torch.preserve_format)
                # AdamW's loader expects a step count in every state (and it is worth having).
                state["step"] = torch.tensor(0.0)
            buffers.append(local(state["momentum_buffer"]))
            counts.append(state["step"])
        torch._foreach_add_(counts, 1)
        grads = [local(p.grad) for p in params]
        torch._foreach_lerp_(buffers, grads, 1 - momentum)
        return torch._foreach_lerp(grads, buffers, momentum) if group["nesterov"] else buffers


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This process's part of ``tensor``: its local shard for a DTensor, else the tensor itself."""
    return tensor.to_local() if hasattr(tensor, "device_mesh") else tensor


def whole_tensor(local_update: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """The whole matrix of which ``local_update`` is this process's shard, sharded as ``param`` (an all-gather)."""
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(local_update, param.device_mesh, param.placements, run_check=False, shape=param.shape,
                              stride=param.stride()).full_tensor()


def own_rows(param: torch.Tensor, start: int, stop: int, orthogonal: torch.Tensor):
    """(the rows of ``param`` this process holds within logical rows start:stop, the matching ``orthogonal`` rows):
    the rows start:stop of a whole matrix, the intersection with this process's box of a sharded one (maybe none)."""
    if not is_sharded(param):
        return [(param if (start, stop) == (0, param.shape[0]) else param[start:stop], orthogonal)]
    shard, (rows, cols) = param.to_local(), local_box(param)
    first, last = max(start, rows.start), min(stop, rows.stop)
    if first >= last:
        return []
    return [(shard[first - rows.start:last - rows.start], orthogonal[first - start:last - start, cols])]


class MuonOptimizer(OptimizerType):
    """Muon for hidden matrices (q, k, v, attention output, MLP in/gate/out), AdamW for the rest.

    Routed by each parameter's declared kind: ``hidden`` goes to Muon, ``embedding``, ``head``, ``vector``,
    ``scalar`` and the roles listed in ``adamw_roles`` go to AdamW. Fused q|k|v and value|gate matrices are
    orthogonalised per logical matrix. Undeclared parameters are an error (routing them by shape is the
    classic silent mistake). Under ``mup`` the hidden matrices follow its rule for Muon (no 1/m_d, spectral
    adjustment); ``mup_wd`` and ``completep`` are refused. DDP and FSDP2 (whole matrices gathered) equal one process.

    Args:
        lr: Muon's peak learning rate, before ``adjust_lr``; None: ``--model.lr`` (pair with ``match_rms_adamw``).
            Keller Jordan's recipe: 0.02 with ``original``.
        weight_decay: Muon's decoupled weight decay; None: ``--model.weight_decay``.
        momentum: Muon's momentum (0.95).
        nesterov: Nesterov momentum, as the reference.
        ns_steps: Newton-Schulz iterations (5).
        adjust_lr: ``original`` (sqrt(max(1, rows/cols)), Keller Jordan, torch's default), ``match_rms_adamw``
            (0.2 sqrt(max(rows, cols)), Moonlight) or ``spectral`` (sqrt(rows/cols), Bernstein). None: the
            parametrization's rule for Muon where it declares one (``mup``: ``spectral``), else ``match_rms_adamw``.
        adamw_roles: roles of kind ``hidden`` that go to AdamW instead (e.g. a plugin's matrices that are not
            linear maps of the stream).
        lr_multipliers: per role or kind, relative to the group's learning rate (Muon's for hidden matrices,
            ``--model.lr`` for the rest), e.g. ``{mlp_out: 2, embedding: 0.3, head: 0.003125}``.
        wd_multipliers: per role or kind, relative to the group's weight decay.
        role_betas: AdamW betas of a role or kind where they differ from ``--model.betas``.
        eps: AdamW's epsilon.
    """

    def __init__(self, lr: float | None = None, weight_decay: float | None = None, momentum: float = 0.95,
                 nesterov: bool = True, ns_steps: int = 5, adjust_lr: str | None = None,
                 adamw_roles: list[str] | None = None, lr_multipliers: dict[str, float] | None = None,
                 wd_multipliers: dict[str, float] | None = None, role_betas: dict[str, list[float]] | None = None,
                 eps: float = 1e-8):
        if adjust_lr is not None and adjust_lr not in ADJUST_LR:
            raise PluginError(f"adjust_lr {adjust_lr!r} is not one of {', '.join(ADJUST_LR)} (or null)")
        if lr is not None and not lr > 0:
            raise PluginError(f"lr must be > 0 (or null for --model.lr), got {lr}")
        if not 0 <= momentum < 1:
            raise PluginError(f"momentum must be in [0, 1), got {momentum}")
        if not (isinstance(ns_steps, int) and 0 < ns_steps < 100):
            raise PluginError(f"ns_steps must be an integer in 1..99, got {ns_steps!r}")
        self.lr, self.weight_decay, self.momentum, self.nesterov = lr, weight_decay, float(momentum), bool(nesterov)
        self.ns_steps, self.adjust_lr, self.adamw_roles = ns_steps, adjust_lr, set(adamw_roles or ())
        self.lr_multipliers = check_multipliers("lr_multipliers", lr_multipliers)
        self.wd_multipliers = check_multipliers("wd_multipliers", wd_multipliers)
        self.role_betas = check_betas(role_betas)
        self.eps = float(eps)

    def takes(self, p: ParameterRole) -> bool:
        """Whether parameter ``p`` steps by Muon."""
        parts = {role for role, _, _ in p.slices} if p.slices else {p.role}
        return p.kind == Kind.HIDDEN and not parts & self.adamw_roles and p.role not in self.adamw_roles

    def routing(self, model: nn.Module) -> dict[str, str]:
        """``{parameter name: "muon" | "adamw"}``: what the recipe's settings route where."""
        return {p.name: "muon" if self.takes(p) else "adamw" for p in self._roles(model)}

    def _roles(self, model: nn.Module) -> list[ParameterRole]:
        try:
            return parameter_roles(model, strict=True)
        except UndeclaredRoleError as exc:
            raise PluginError(f"muon routes parameters by their declared role: {exc}") from exc

    def build(self, model: nn.Module, *, lr: float, weight_decay: float,
              betas: tuple[float, float]) -> MuonWithAdamW:
        roles = self._roles(model)
        muon_lr = lr if self.lr is None else self.lr
        muon_wd = weight_decay if self.weight_decay is None else self.weight_decay
        entries, derived, stated, decay = [], adam_rules(model), muon_rules(model), decays(model)
        for p, lr_mult, wd_mult, declared in settings(model, roles, lr_multipliers=self.lr_multipliers,
                                                      wd_multipliers=self.wd_multipliers,
                                                      role_betas=self.role_betas):
            if not self.takes(p):
                entries.append((p, {"lr": lr * lr_mult, "lr_ratio": lr_mult, "weight_decay": weight_decay * wd_mult,
                                    "muon": False, **own_betas(self.role_betas, p), **own_eps(self.eps, declared)}))
                continue
            rule, adjust_lr = stated.get(id(p.param)), self.adjust_lr or "match_rms_adamw"
            if rule is not None and declared == rule.adam:  # the parametrization's own rule for Muon
                if self.adjust_lr not in (None, rule.adjust_lr):
                    raise PluginError(f"adjust_lr {self.adjust_lr!r} contradicts {rule.source}'s rule for Muon (the "
                                      f"{rule.adjust_lr} adjustment on every hidden matrix); drop adjust_lr or set it "
                                      f"to {rule.adjust_lr}")
                lr_mult = multiplier(self.lr_multipliers, p) * rule.muon.lr
                wd_mult = multiplier(self.wd_multipliers, p) * rule.muon.weight_decay if decay[id(p.param)] else 0.0
                adjust_lr = rule.adjust_lr
            elif id(p.param) in derived or not declared.is_default:
                # A parametrization's multipliers are derived for Adam; applying them to Muon's orthogonalised step
                # would double-scale it (Megatron-LM PR 3715's bug). Decided from the declaration that a rule
                # exists, not from its value (1 at the base width), so a ladder cannot pass its base rung only.
                source = derived.get(id(p.param), "a plugin's optimizer scale")
                raise PluginError(f"{p.name} (role {p.role}) is scaled by {source}'s Adam-derived rule at every width "
                                  f"and muon would step it: muon with {source} is not implemented ({source} states "
                                  f"no rule for Muon; mup does: no 1/m_d on the lr, spectral scale "
                                  f"sqrt(fan_out/fan_in)); use --model.arch.parametrization=mup, "
                                  f"--model.optimizer=adamw or --model.arch.parametrization=sp")
            if p.param.dim() != 2:
                raise PluginError(f"{p.name} (role {p.role}, shape {tuple(p.param.shape)}) is a hidden parameter "
                                  f"but not a matrix; Muon orthogonalises matrices: route its role to AdamW with "
                                  f"--model.optimizer_options.adamw_roles=[{p.role}]")
            if unsupported := unsupported_placements(p.param):
                raise PluginError(f"muon gathers each sharded matrix whole, and {p.name} is sharded as "
                                  f"{', '.join(unsupported)} (not plain row or column shards): "
                                  f"not implemented; shard with FSDP2 (lit.parallel.FSDP2Strategy) or use DDP")
            entries.append((p, {"lr": muon_lr * lr_mult, "lr_ratio": muon_lr * lr_mult / lr if lr else lr_mult,
                                "weight_decay": muon_wd * wd_mult, "muon": True, "momentum": self.momentum,
                                "nesterov": self.nesterov, "ns_steps": self.ns_steps, "adjust_lr": adjust_lr}))
        groups = param_groups([(p.param, options) for p, options in entries])
        slices = {id(p.param): [(a, b) for _, a, b in p.slices] if p.slices else [(0, p.param.shape[0])]
                  for p, options in entries if options["muon"]}
        for group in groups:
            if group["muon"]:
                group["slices"] = [slices[id(param)] for param in group["params"]]
        return MuonWithAdamW(groups, lr=lr, betas=tuple(betas), eps=self.eps)
