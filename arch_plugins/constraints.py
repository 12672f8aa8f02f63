"""Projecting declared weights back onto the unit sphere (nGPT's renormalisation), on plain tensors and DTensors.

Which weights, and along which axis, the modules that own them declare (``declare_unit_norm``, in
``arch_plugins.declarations``, re-exported here): parameter names change under wrappers (FSDP, compile) and
with every new projection type; the module that owns a weight knows which of its axes is d_model.
"""

from __future__ import annotations

import torch
from torch import nn

from arch_plugins.declarations import declare_unit_norm, unit_norm_parameters

__all__ = ["declare_unit_norm", "unit_norm_parameters", "renormalize_", "is_dtensor"]

@torch.no_grad()
def renormalize_(model: nn.Module, eps: float = 0.0) -> int:
    """Project every declared weight back onto the unit sphere, in fp32; returns how many were touched.

    Works on plain tensors and on DTensors without gathering a full weight. For FSDP2's layout (a 1-D
    mesh, ``Shard(0)``) each rank works on its local shard: along an unsharded dim the norm is local;
    the weights normalised along the sharded dim share ONE all-reduce of their per-column sums of
    squares (one collective per step instead of one per weight, and no DTensor dispatch per op). Other
    layouts go through DTensor ops. Every rank must call this (it is collective).
    """
    count = 0
    across_shards: list[tuple[torch.Tensor, torch.Tensor]] = []  # (parameter, its local shard)
    for _, param, dim in unit_norm_parameters(model):
        count += 1
        if is_dtensor(param) and _fsdp2_layout(param):
            local = param.to_local()
            if dim % param.dim() == 0:
                across_shards.append((param, local))
            else:
                _normalize_(local, dim, eps)
        elif is_dtensor(param):
            _normalize_dtensor_(param, dim, eps)
        else:
            _normalize_(param, dim, eps)
    for mesh in {param.device_mesh for param, _ in across_shards}:  # FSDP2 uses one mesh; be safe with more
        _normalize_across_shards_([(p, local) for p, local in across_shards if p.device_mesh == mesh], eps)
    return count


def _normalize_(w: torch.Tensor, dim: int, eps: float) -> None:
    x = w.float()  # the same tensor when it is fp32: divided in place, no temporary
    norm = torch.linalg.vector_norm(x, dim=dim, keepdim=True)
    if eps:
        norm = norm + eps
    if x is w:
        w.div_(norm)
    else:
        w.copy_(x / norm)


def _normalize_across_shards_(params: list[tuple[torch.Tensor, torch.Tensor]], eps: float) -> None:
    import torch.distributed as dist

    sums = [local.float().square().sum(dim=0) for _, local in params]  # a rank may hold no rows: zeros
    flat = torch.cat([s.flatten() for s in sums])
    dist.all_reduce(flat, group=params[0][0].device_mesh.get_group())
    norms = flat.sqrt().split([s.numel() for s in sums])
    for (_, local), norm, shape in zip(params, norms, (s.shape for s in sums), strict=True):
        norm = norm.view(shape)  # the weight without its dim 0 (a conv kernel keeps its other dims)
        local.copy_(local.float() / (norm + eps if eps else norm))


def _fsdp2_layout(param: torch.Tensor) -> bool:
    from torch.distributed.tensor import Shard

    return param.device_mesh.ndim == 1 and tuple(param.placements) == (Shard(0),)


def _normalize_dtensor_(param: torch.Tensor, dim: int, eps: float) -> None:
    w = param.float()
    norm = torch.linalg.vector_norm(w, dim=dim, keepdim=True)
    normalized = (w / (norm + eps if eps else norm)).to(param.dtype)
    if normalized.placements != param.placements:
        # DTensor may place the quotient differently (a (1, n) weight normalised along its sharded dim 0
        # comes back Shard(1)); copy_ needs the parameter's own layout, so each rank keeps its shard.
        normalized = normalized.redistribute(param.device_mesh, param.placements)
    param.copy_(normalized)


def is_dtensor(t: torch.Tensor) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch built without distributed support: there are no DTensors either
        return False
    return isinstance(t, DTensor)
