"""Muon's shape groups split among N gloo processes (tests/test_muon_batched.py): each process's weights after the
steps of tests/muon_sharded_worker.py's problem, on whole tensors (as DDP holds them) and on DTensor shards (as FSDP2
holds them), and how many matrices this process orthogonalised itself in each run.

    python tests/muon_split_worker.py --out result.pt   # writes result.pt.rank<R> on each process
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere, as pytest's subprocess does

from arch_plugins.optimizers import shape_groups  # noqa: E402
from tests import muon_sharded_worker as problem  # noqa: E402


def counted(run) -> tuple[list[torch.Tensor], int]:
    """``run()``'s result and the number of matrices this process passed to Newton-Schulz during it."""
    seen, original = [], shape_groups.orthogonalize_stack

    def counting(stack, *args, **kwargs):
        seen.append(stack.shape[0])
        return original(stack, *args, **kwargs)

    shape_groups.orthogonalize_stack = counting
    try:
        return run(), sum(seen)
    finally:
        shape_groups.orthogonalize_stack = original


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
        whole, whole_count = counted(problem.train)
        sharded, sharded_count = counted(lambda: problem.train(mesh))
        torch.save({"whole": whole, "whole_count": whole_count, "sharded": sharded, "sharded_count": sharded_count},
                   f"{args.out}.rank{dist.get_rank()}")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
