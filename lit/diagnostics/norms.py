"""Gradient, weight and update norms per transformer block and per parameter role, global under FSDP2.

A parameter's group inside its block is the one its declared role reports under
(``arch_plugins.declarations.parameter_roles``, field ``group``): ``qkv`` (q, k, v and their bias), ``attn_out``,
``mlp_in`` (value and gate of a SwiGLU), ``mlp_out``, ``ffn`` (a feed-forward made by the projection type, e.g.
Pattention), ``norms`` (the norm strategy's gains, biases and scalars), ``residual`` (the residual type's own
parameters), ``other`` for a parameter whose module declared no role.

Norms are global, never per shard. Under FSDP2 every parameter (and its gradient) is a DTensor sharded on
dim 0 of a 1-D mesh: each rank squares and sums its local shard and ONE all-reduce adds the per-parameter
sums of gradients, weights and updates together (a few hundred floats), instead of one gather per
parameter. Plain tensors (one process, DDP, where every rank holds the whole reduced gradient) need no
collective. Other layouts (2-D meshes, tensor parallelism) are not made by ``lit.parallel.shard`` and are refused.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from arch_plugins.constraints import is_dtensor
from arch_plugins.declarations import role_declarations
from lit.errors import UserInputError
from lit.parallel import blocks as model_blocks
from lit.tracking.names import layer_name

GLOBAL = "global"


class ParameterGroups:
    """Every parameter of a model once, and the groups it counts in: ``global``, ``layerNN``, ``layerNN.<role>``.

    Built once per fit from the model as the strategy left it (FSDP2 and compile keep parameter identity
    and names), so a recording step costs no module walk.
    """

    def __init__(self, model: nn.Module):
        blocks = model_blocks(model)
        roles = role_declarations(model)
        where: dict[int, list[str]] = {}
        for index, block in enumerate(blocks):
            for param in block.parameters():
                group = roles[id(param)][1].group if id(param) in roles else "other"
                where.setdefault(id(param), [layer_name(index), f"{layer_name(index)}.{group}"])
        self.params: list[nn.Parameter] = []
        self.groups: list[str] = [GLOBAL]
        members: list[tuple[int, int]] = []  # (parameter index, group index)
        group_index = {GLOBAL: 0}
        for param in model.parameters():  # each parameter once, tied ones too
            i = len(self.params)
            self.params.append(param)
            for group in [GLOBAL, *where.get(id(param), [])]:
                if group not in group_index:
                    group_index[group] = len(self.groups)
                    self.groups.append(group)
                members.append((i, group_index[group]))
        self._members = torch.tensor(members, dtype=torch.long).reshape(-1, 2)
        self.sharded = [_sharded(p) for p in self.params]
        # Index tensors copied to the device once, not at every step: a copy from host memory is a host-device
        # sync on a GPU (the spike statistics use ``reduce`` at every optimizer step).
        self._on_device: dict[tuple[str, torch.device], torch.Tensor] = {}

    def _device_copy(self, name: str, make, device: torch.device) -> torch.Tensor:
        key = (name, device)
        if key not in self._on_device:
            self._on_device[key] = make().to(device)
        return self._on_device[key]

    def group_norms(self, squares: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-parameter sums of squares (n,) -> {group: norm} (0-d tensors on the same device)."""
        members = self._device_copy("members", lambda: self._members, squares.device)
        sums = torch.zeros(len(self.groups), dtype=squares.dtype, device=squares.device)
        sums.index_add_(0, members[:, 1], squares[members[:, 0]])
        return dict(zip(self.groups, sums.sqrt(), strict=True))

    def local(self, tensors: Sequence[torch.Tensor | None]) -> list[torch.Tensor]:
        """What this rank holds of each tensor (its shard under FSDP2), an empty tensor for a missing one."""
        return [_local(t) for t in tensors]

    def squares(self, tensors: Sequence[torch.Tensor | None]) -> torch.Tensor:
        """Per-parameter sums of squares of this rank's part, in fp32: (n,). Not yet reduced across shards."""
        parts = self.local(tensors)
        device = next((p.device for p in parts if p.numel()), self.params[0].device)
        dense = [p for p in parts if p.numel()]
        norms = iter(torch._foreach_norm(dense, 2, dtype=torch.float32)) if dense else iter(())
        return torch.stack([next(norms).square().to(device) if p.numel() else torch.zeros((), device=device)
                            for p in parts])

    def reduce(self, *squares: torch.Tensor) -> list[torch.Tensor]:
        """Adds the shards' sums of squares of every FSDP2 parameter, for all given vectors in ONE all-reduce
        (one per device mesh; FSDP2 as ``lit.parallel.shard`` applies it uses one)."""
        if not any(self.sharded):
            return list(squares)
        import torch.distributed as dist

        out = [s.clone() for s in squares]
        meshes: dict[int, list[int]] = {}
        for i, (param, sharded) in enumerate(zip(self.params, self.sharded, strict=True)):
            if sharded:
                meshes.setdefault(id(param.device_mesh), []).append(i)
        for mesh, indices in meshes.items():
            index = self._device_copy(f"mesh{mesh}", lambda indices=indices: torch.tensor(indices), squares[0].device)
            flat = torch.cat([s[index] for s in squares])
            dist.all_reduce(flat, group=self.params[indices[0]].device_mesh.get_group())
            for o, reduced in zip(out, flat.split(len(indices)), strict=True):
                o[index] = reduced
        return out


def _local(t: torch.Tensor | None) -> torch.Tensor:
    if t is None:
        return torch.empty(0)
    t = t.detach()
    t = t.to_local() if is_dtensor(t) else t
    if t.numel() and t.untyped_storage().nbytes() == 0:
        # FSDP2 under torchrun leaves the root unit's parameters (embedding, head) as views of a freed buffer
        # between backward and the optimizer step: reading them would read freed memory (a segfault seen on
        # 2 nodes). They belong to no block, so no logged weight norm or update ratio needs them.
        return torch.empty(0, device=t.device)
    return t


def _sharded(t: torch.Tensor) -> bool:
    """Whether the norm of ``t`` needs the other ranks' shards: FSDP2's layout (1-D mesh, sharded). A DTensor
    replicated on its mesh holds it all; other layouts are not what ``lit.parallel.shard`` makes."""
    if not is_dtensor(t):
        return False
    from torch.distributed.tensor import Replicate, Shard

    if t.device_mesh.ndim == 1 and isinstance(t.placements[0], Shard):
        return True
    if all(isinstance(p, Replicate) for p in t.placements):
        return False
    raise UserInputError(f"diagnostics cannot compute global norms of a parameter laid out as {t.placements} on a "
                         f"{t.device_mesh.ndim}-D mesh (FSDP2 on a 1-D mesh is supported); drop 'grads' and 'spikes' "
                         "from --model.diagnostics.record")
