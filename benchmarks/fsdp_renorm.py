"""What keeping nGPT's weights on the sphere costs per step under FSDP2, against DDP.

Two processes (gloo on CPU, NCCL on GPUs), the same nGPT, the same data. Each optimizer step is
timed in two parts: forward + backward + AdamW step, then ``renormalize_`` (the unit-norm callback's
work). Under DDP every rank renormalises its full replica locally; under FSDP2 every rank renormalises
its DTensor shards, and weights normalised along their sharded dim (attention and MLP output
projections) need one all-reduce of squared norms each. Medians over the timed steps of rank 0.

    python -m benchmarks.fsdp_renorm               # CPU, 2 processes
    python -m benchmarks.fsdp_renorm --device cuda # 2 GPUs
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from arch_plugins.constraints import renormalize_, unit_norm_parameters
from lit.models import GPT, TransformerConfig
from lit.parallel import shard

RESULTS = Path(__file__).parent / "results"


def build(args) -> GPT:
    torch.manual_seed(0)
    cfg = TransformerConfig(d_model=args.d_model, n_layers=args.n_layers, n_heads=args.n_heads,
                            norm="hypersphere", residual="ngpt", init_std=args.d_model ** -0.5)
    return GPT(args.vocab, args.seq, cfg, tie_embeddings=False)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def worker(rank: int, world: int, args, port: int, out: str) -> None:
    torch.set_num_threads(args.threads)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    device = torch.device(f"cuda:{rank}" if args.device == "cuda" else "cpu")
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo", rank=rank, world_size=world)
    results = {}
    for strategy in ("ddp", "fsdp2"):
        model = build(args).to(device)
        renormalize_(model)
        if strategy == "ddp":
            device_ids = [rank] if args.device == "cuda" else None
            trained = torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
        else:
            from torch.distributed.device_mesh import init_device_mesh

            trained = shard(model, init_device_mesh(args.device, (world,)))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
        g = torch.Generator().manual_seed(rank)
        idx = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=g).to(device)
        step_times, renorm_times = [], []
        for i in range(args.warmup + args.steps):
            dist.barrier()
            sync(device)
            t0 = time.perf_counter()
            logits = trained(idx[:, :-1])
            torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), idx[:, 1:].flatten()).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            sync(device)
            t1 = time.perf_counter()
            renormalize_(model)
            sync(device)
            t2 = time.perf_counter()
            if i >= args.warmup:
                step_times.append(t1 - t0)
                renorm_times.append(t2 - t1)
        results[strategy] = {"step_ms": 1e3 * statistics.median(step_times),
                             "renorm_ms": 1e3 * statistics.median(renorm_times),
                             "unit_norm_weights": sum(1 for _ in unit_norm_parameters(model))}
        del trained, model, opt
    if rank == 0:
        Path(out).write_text(json.dumps(results))
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="torch threads per process (CPU)")
    p.add_argument("--d_model", type=int, default=256)
    p.add_argument("--n_layers", type=int, default=6)
    p.add_argument("--n_heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=4, help="sequences per process")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=15)
    args = p.parse_args()
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = RESULTS / f"fsdp_renorm_{args.device}.json"
    RESULTS.mkdir(exist_ok=True)
    mp.spawn(worker, args=(args.world, args, port, str(out)), nprocs=args.world, join=True)
    results = json.loads(out.read_text())
    results["config"] = vars(args)
    out.write_text(json.dumps(results, indent=2))
    print(f"{args.world} processes on {args.device}, d={args.d_model} L={args.n_layers} seq {args.seq} "
          f"batch {args.batch}/process")
    print("| strategy | step (fwd+bwd+AdamW) ms | renormalisation ms | renorm / step |")
    print("|---|---:|---:|---:|")
    for name in ("ddp", "fsdp2"):
        r = results[name]
        print(f"| {name} | {r['step_ms']:.1f} | {r['renorm_ms']:.2f} | {100 * r['renorm_ms'] / r['step_ms']:.1f}% |")
    print(f"FSDP2 / DDP renormalisation time: {results['fsdp2']['renorm_ms'] / results['ddp']['renorm_ms']:.2f}")


if __name__ == "__main__":
    main()
