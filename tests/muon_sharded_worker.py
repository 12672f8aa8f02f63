"""Muon's step on parameters sharded as FSDP2 shards them (DTensors) on N gloo processes (tests/test_distributed.py).

The same parameters and gradients on every process, each process holding its shards: after a few steps the
gathered weights must equal the steps of one process on whole tensors, bit for bit (the whole update is gathered,
each process orthogonalises its share of every shape group and an all-gather brings the rest, and each process
applies its own rows). The shapes cover fused matrices (two and three logical parts), rows that do not split
evenly, a matrix with fewer rows than processes (one process holds an empty shard), a column shard, shape groups
of one, three (tall parts joining a wide matrix) and four matrices, and an AdamW-stepped parameter in the same
optimizer.

    python tests/muon_sharded_worker.py --world 2 --out weights.pt
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere, as pytest's subprocess does

from arch_plugins.optimizers.muon import MuonWithAdamW  # noqa: E402

STEPS = 3
# (rows, columns), logical row slices, sharded dim
MUON = [((9, 6), [(0, 3), (3, 9)], 0), ((5, 4), [(0, 5)], 0), ((1, 3), [(0, 1)], 0), ((4, 7), [(0, 4)], 1),
        ((12, 4), [(0, 4), (4, 8), (8, 12)], 0), ((4, 4), [(0, 4)], 1), ((16, 4), [(0, 8), (8, 16)], 0),
        ((4, 8), [(0, 4)], 0)]
ADAM = [((3, 5), 0)]


def problem() -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
    """Initial weights and per-step gradients (Muon's matrices first, then AdamW's)."""
    g = torch.Generator().manual_seed(0)
    shapes = [shape for shape, _, _ in MUON] + [shape for shape, _ in ADAM]
    weights = [torch.randn(shape, generator=g) for shape in shapes]
    grads = [[torch.randn(shape, generator=g) for shape in shapes] for _ in range(STEPS)]
    return weights, grads


def optimizer(params: list[nn.Parameter], optimizer_class: type = MuonWithAdamW) -> MuonWithAdamW:
    n = len(MUON)
    return optimizer_class([
        {"params": params[:n], "muon": True, "lr": 0.05, "weight_decay": 0.1, "momentum": 0.95, "nesterov": True,
         "ns_steps": 5, "adjust_lr": "original", "slices": [slices for _, slices, _ in MUON]},
        {"params": params[n:], "muon": False, "lr": 0.01, "weight_decay": 0.1},
    ], lr=0.01, betas=(0.9, 0.95), eps=1e-8)


def train(mesh=None, optimizer_class: type = MuonWithAdamW) -> list[torch.Tensor]:
    """The weights after ``STEPS`` steps: on whole tensors (``mesh`` None) or on shards over ``mesh``, stepped by
    ``optimizer_class`` (another version of Muon, for a test's reference)."""
    weights, grads = problem()
    dims = [dim for _, _, dim in MUON] + [dim for _, dim in ADAM]

    def place(t: torch.Tensor, dim: int) -> torch.Tensor:
        if mesh is None:
            return t.clone()
        from torch.distributed.tensor import Shard, distribute_tensor

        return distribute_tensor(t, mesh, [Shard(dim)])

    params = [nn.Parameter(place(w, dim)) for w, dim in zip(weights, dims, strict=True)]
    opt = optimizer(params, optimizer_class)
    for step in grads:
        for p, grad, dim in zip(params, step, dims, strict=True):
            p.grad = place(grad, dim)
        opt.step()
    return [(p.full_tensor() if mesh is not None else p).detach().clone() for p in params]


def main(argv: list[str] | None = None) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    # torchrun-style environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (set by the test)
    dist.init_process_group("gloo")
    try:
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        result = train(mesh)
        if dist.get_rank() == 0:
            torch.save(result, args.out)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
