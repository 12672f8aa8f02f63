"""Weights that must live on the unit sphere declare it themselves, with the axis to normalise along.

A callback (nGPT's renormalisation) walks modules and asks, instead of matching parameter names:
parameter names change under wrappers (FSDP, compile) and with every new projection type; the
module that owns a weight knows which of its axes is d_model.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

_ATTR = "unit_norm_dims"


def declare_unit_norm(module: nn.Module, param_name: str, dim: int) -> None:
    """Declare that ``module.<param_name>`` must keep unit L2 norm along ``dim``."""
    if not isinstance(getattr(module, param_name, None), nn.Parameter):
        raise ValueError(f"{type(module).__name__} has no parameter {param_name!r} to constrain")
    dims = dict(getattr(module, _ATTR, {}))
    dims[param_name] = dim
    # A plain attribute (not a buffer): it survives FSDP/compile wrapping and is not saved in checkpoints.
    object.__setattr__(module, _ATTR, dims)


def unit_norm_parameters(model: nn.Module) -> Iterator[tuple[str, nn.Parameter, int]]:
    """Every declared (qualified name, parameter, dim), each parameter once (tied weights share one)."""
    seen: set[int] = set()
    for module_name, module in model.named_modules():
        for param_name, dim in getattr(module, _ATTR, {}).items():
            param = getattr(module, param_name)
            if id(param) in seen:
                continue
            seen.add(id(param))
            yield (f"{module_name}.{param_name}" if module_name else param_name), param, dim


@torch.no_grad()
def renormalize_(model: nn.Module, eps: float = 0.0) -> int:
    """Project every declared weight back onto the unit sphere, in fp32; returns how many were touched.

    Works on plain tensors and on DTensors (FSDP2 shards parameters on dim 0) without gathering a full
    weight: along an unsharded dim the norm is local; along the sharded dim ``vector_norm`` returns a
    partial placement that the division resolves with one all-reduce of the sums of squares
    (platform.md §5). Every rank must call this (it is collective for sharded weights).
    """
    count = 0
    for _, param, dim in unit_norm_parameters(model):
        w = param.float()
        norm = torch.linalg.vector_norm(w, dim=dim, keepdim=True)
        if eps:
            norm = norm + eps
        count += 1
        if w is param and not _is_dtensor(param):  # fp32 on one device: divide in place, no temporary
            param.div_(norm)
            continue
        normalized = (w / norm).to(param.dtype)
        if _is_dtensor(normalized) and normalized.placements != param.placements:
            # DTensor may place the quotient differently (a (1, n) weight normalised along its sharded dim 0
            # comes back Shard(1)); copy_ needs the parameter's own layout, so each rank keeps its shard.
            normalized = normalized.redistribute(param.device_mesh, param.placements)
        param.copy_(normalized)
    return count


def _is_dtensor(t: torch.Tensor) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch built without distributed support: there are no DTensors either
        return False
    return isinstance(t, DTensor)
