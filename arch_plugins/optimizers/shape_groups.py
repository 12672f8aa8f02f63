"""Muon's matrices orthogonalised by shape group: stacked, one batched Newton-Schulz per group, shared among processes.

One Newton-Schulz call per matrix is about 25 small operator calls, so at 124M (84 matrices) the step was paid in
dispatch, not in FLOPs (``../shared/specs/gpu-plugins.md`` §2.4). Matrices of one shape are stacked and orthogonalised
in one batched call (as karpathy/nanochat and modded-nanogpt do); a tall matrix joins the group of its transpose, as
Newton-Schulz iterates on the wide orientation anyway (the MLP's in and gate matrices join its out matrix).

With more than one process (DDP, FSDP2), every process holds the same whole updates (DDP all-reduced the gradients;
Muon all-gathered FSDP2's shards), so each process orthogonalises a contiguous share of every group and one
all-gather per group gives every process all the results (KellerJordan/Muon's distributed step, by group). The
results travel as bf16, Newton-Schulz's own dtype, and every process applies the same bits: the processes cannot
drift apart. This assumes what the project's strategies guarantee: every process of the default process group steps
the same parameters in the same order (no pipeline stages).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from arch_plugins.optimizers.newton_schulz import orthogonalize_stack


def processes() -> tuple[int, int]:
    """(this process's rank, the number of processes) that share the orthogonalisation: the default process group's,
    or (0, 1) without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def orthogonalize_by_shape(matrices: list[torch.Tensor], steps: list[int]) -> list[torch.Tensor]:
    """Each of the 2-D ``matrices`` orthogonalised with its number of Newton-Schulz ``steps`` (bf16, in its own
    orientation): one batched call per (wide shape, steps, device, dtype) group, each group shared among processes."""
    groups: dict[tuple, list[int]] = {}  # insertion order: the same on every process, as the collectives need
    for i, matrix in enumerate(matrices):
        rows, cols = matrix.shape
        groups.setdefault((min(rows, cols), max(rows, cols), steps[i], matrix.device, matrix.dtype), []).append(i)
    rank, world = processes()
    out: list[torch.Tensor | None] = [None] * len(matrices)
    for (rows, cols, group_steps, _, _), members in groups.items():
        wide = [matrices[i].mT if matrices[i].shape[0] > rows else matrices[i] for i in members]
        for i, result in zip(members, _shared(wide, rows, cols, group_steps, rank, world).unbind(0), strict=True):
            out[i] = result.mT if matrices[i].shape[0] > rows else result
    return out


def _shared(wide: list[torch.Tensor], rows: int, cols: int, steps: int, rank: int, world: int) -> torch.Tensor:
    """The (n, rows, cols) orthogonalised stack of the ``wide`` matrices: this process computes its share, an
    all-gather brings the others'."""
    if world == 1:
        return orthogonalize_stack(torch.stack(wide), steps=steps)
    share = -(-len(wide) // world)  # ceil: the last processes may have fewer (or none) and pad with zeros
    mine = wide[rank * share:(rank + 1) * share]
    if len(mine) == share:
        result = orthogonalize_stack(torch.stack(mine), steps=steps)
    else:
        result = torch.zeros(share, rows, cols, dtype=torch.bfloat16, device=wide[0].device)
        if mine:
            result[:len(mine)] = orthogonalize_stack(torch.stack(mine), steps=steps)
    gathered = result.new_empty(world * share, rows, cols)
    # all_gather_single is all_gather_into_tensor's newer name (torch 2.14 deprecates the old one; 2.6 lacks the new)
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    all_gather(gathered, result)
    return gathered[:len(wide)]
