"""One short data-parallel run on 2 CPU processes (gloo), against one process on the whole batch.

Each rank trains on its own half of every batch (different data per rank), so state a plugin updates in its
forward pass (batch statistics) equals one process's only if the plugin synchronises it, and state derived on a
schedule (progress hooks) equals it only if every rank derives it alike. The ranks are forked from the calling
process, so a plugin registered in-process (``registry.register``) is there too.
"""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from arch_plugins.progress import TrainingProgress, advance
from arch_plugins.testing.stacks import Built

WORLD = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train(build: Callable[[], Built], steps: int, rank: int = 0, world: int = 1) -> dict[str, torch.Tensor]:
    built = build()
    inner = built.model
    model = torch.nn.parallel.DistributedDataParallel(inner) if world > 1 else inner
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model.train()
    for step in range(steps):
        advance(inner, TrainingProgress(step, steps))
        whole = built.example(torch.Generator().manual_seed(100 + step))
        share = whole.shape[0] // world
        model(whole[rank * share:(rank + 1) * share]).float().square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    return {k: v.detach().clone() for k, v in inner.state_dict().items()}


def _rank(rank: int, build: Callable[[], Built], steps: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        torch.save(_train(build, steps, rank, WORLD), Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def two_process_steps(build: Callable[[], Built], steps: int) -> tuple[dict, list[dict]]:
    """(one process's state after ``steps`` on whole batches, each rank's state after the same steps on halves)."""
    single = _train(build, steps)
    with tempfile.TemporaryDirectory() as out:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        # fork: the ranks inherit this process's imports and in-process registrations (no pickling of `build`).
        torch.multiprocessing.start_processes(_rank, args=(build, steps, _free_port(), out), nprocs=WORLD,
                                              join=True, start_method="fork")
        ranks = [torch.load(Path(out) / f"rank{r}.pt") for r in range(WORLD)]
    return single, ranks
