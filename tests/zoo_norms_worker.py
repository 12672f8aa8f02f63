"""Trains a tiny GPT with PRepBN, BHyT, UN or PowerNorm for a few steps, data-parallel on 2 gloo processes or on one.

Run as a script by tests/test_zoo_norms_distributed.py (2 forked ranks under
``torch.nn.parallel.DistributedDataParallel``); the single-process reference is ``train(kind, world=1)``.
Each rank trains on its own half of every global batch (different data per rank), so:

- PRepBN's, UN's and PowerNorm's batch statistics are the global batch's only if they are synchronised (their
  all-reduce; UN's and PowerNorm's backward statistics too), and then the running statistics and the weights equal
  one process's on the whole batch;
- BHyT's c_attn, recomputed from the weights on its schedule, is the same on every rank and equals one
  process's.

    python tests/zoo_norms_worker.py --out DIR      # writes DIR/rank0.pt and DIR/rank1.pt
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere, as pytest's subprocess does

from arch_plugins.progress import TrainingProgress, advance  # noqa: E402
from lit.models.gpt import GPT  # noqa: E402
from lit.models.transformer import TransformerConfig  # noqa: E402

VOCAB, T, BATCH, STEPS = 13, 8, 4, 4  # BATCH is the global batch; each of 2 ranks takes half
KINDS = {"prepbn": {"alpha_init": 0.5, "bn_zero_init": False, "transition_steps": 4},
         "bhyt": {"refresh_every": 2},
         # Past warmup within the 4 steps: window smoothing, compensation, filtration, the running statistic in use.
         "un": {"warmup_iters": 1, "window_size": 2, "compensation_start": 1, "outlier_filtration": True},
         "powernorm": {"warmup_iters": 2, "final_warmup_iters": 1}}


def build(kind: str) -> GPT:
    torch.manual_seed(0)
    return GPT(VOCAB, T, TransformerConfig(d_model=16, n_layers=2, n_heads=2, norm=kind, norm_options=KINDS[kind],
                                           init_std=0.2))


def global_batches() -> torch.Tensor:
    return torch.randint(0, VOCAB, (STEPS, BATCH, T + 1), generator=torch.Generator().manual_seed(3))


def train(kind: str, rank: int = 0, world: int = 1) -> dict:
    model = build(kind)
    inner = model
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.3)
    share = BATCH // world
    for step, batch in enumerate(global_batches()):
        advance(inner, TrainingProgress(step, STEPS))
        tokens = batch[rank * share:(rank + 1) * share]
        F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten()).backward()
        optimizer.step()
        optimizer.zero_grad()
    return {k: v.detach().clone() for k, v in inner.state_dict().items()}


def _rank(rank: int, port: int, out: str) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        torch.save({kind: train(kind, rank, 2) for kind in KINDS}, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    # fork: the ranks inherit this process's imports (spawning would import torch and the project twice more).
    torch.multiprocessing.start_processes(_rank, args=(args.port, args.out), nprocs=2, join=True, start_method="fork")


if __name__ == "__main__":
    main()
