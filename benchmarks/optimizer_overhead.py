"""What Muon costs a training step over AdamW, at the throughput benchmark's size.

Two copies of the same GPT (``benchmarks/throughput.py``'s defaults: d_model 256, 6 layers, 4 heads, sequence 256,
batch 8, vocabulary 256, SwiGLU, pre-RMSNorm, RoPE, untied head), built in one process from one seed, one stepped
by ``--model.optimizer=adamw`` and one by ``--model.optimizer=muon`` (Muon for the hidden matrices, fused q|k|v
and gate|up orthogonalised per part, 5 Newton-Schulz steps in bf16; AdamW for the rest), each through the
optimizer plugin as a run builds it. A step: forward, cross-entropy, backward, optimizer step, zero_grad.

Protocol (``benchmarks/timing.py``'s, shared by the throughput benchmarks): untimed warmup steps for each, then
``--rounds`` rounds in which both run ``--steps`` timed steps in turn, the order alternating per round, so machine
noise hits both alike. Reported: the median over rounds of the
per-round ratio (Muon step time / AdamW step time) with its range, and the optimizer step alone (timed apart, on
the same gradients), which the noise of forward and backward does not touch.

    python -m benchmarks.optimizer_overhead                         # CPU, 5 rounds of 10 steps
    python -m benchmarks.optimizer_overhead --device cuda --steps 50
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F

from arch_plugins import registry
from benchmarks.timing import interleave, timed
from lit.models import GPT, TransformerConfig

OPTIMIZERS = {"adamw": {}, "muon": {"lr": 0.02, "adjust_lr": "original"}}


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def build(name: str, args) -> tuple[GPT, torch.optim.Optimizer]:
    torch.manual_seed(args.seed)
    cfg = TransformerConfig(d_model=args.d_model, n_layers=args.layers, n_heads=args.heads, mlp="swiglu",
                            norm="rmsnorm", residual="add", projection="linear")
    model = GPT(args.vocab, args.seq, cfg).to(args.device)
    optimizer = registry.create("optimizer", name, OPTIMIZERS[name]).build(model, lr=3e-4, weight_decay=0.1,
                                                                            betas=(0.9, 0.95))
    return model, optimizer


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=10, help="timed steps per optimizer per round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--d_model", type=int, default=256)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)

    g = torch.Generator().manual_seed(args.seed + 1)
    idx = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=g).to(args.device)
    contenders = {name: build(name, args) for name in OPTIMIZERS}

    def step(name: str) -> None:
        model, optimizer = contenders[name]
        loss = F.cross_entropy(model(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    device_sync = lambda: sync(args.device)  # noqa: E731

    def per_step(name: str, n: int) -> float:
        return timed(lambda: step(name), n, sync=device_sync) / n

    def optimizer_step_alone(name: str, n: int) -> float:
        model, optimizer = contenders[name]
        F.cross_entropy(model(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten()).backward()
        elapsed = timed(optimizer.step, n, sync=device_sync) / n
        optimizer.zero_grad(set_to_none=True)
        return elapsed

    load_before = os.getloadavg()[0]
    order = list(OPTIMIZERS)
    measured = interleave(
        order, lambda name: (per_step(name, args.steps), optimizer_step_alone(name, args.steps)), args.rounds,
        warmup=lambda name: per_step(name, args.warmup),
        after_round=lambda r, latest: print(f"round {r + 1}/{args.rounds}: " + ", ".join(
            f"{n} {latest[n][0] * 1e3:.1f} ms/step (optimizer {latest[n][1] * 1e3:.1f} ms)" for n in order),
            flush=True))
    times = {name: [whole for whole, _ in values] for name, values in measured.items()}
    alone = {name: [optimizer for _, optimizer in values] for name, values in measured.items()}

    ratios = [m / a for m, a in zip(times["muon"], times["adamw"], strict=True)]
    result = {
        "device": args.device if args.device == "cpu" else torch.cuda.get_device_name(),
        "torch": torch.__version__, "threads": torch.get_num_threads(), "platform": platform.platform(),
        "load_average_before_after": [load_before, os.getloadavg()[0]],
        "size": {k: getattr(args, k) for k in ("d_model", "layers", "heads", "seq", "batch", "vocab")},
        "parameters": sum(p.numel() for p in contenders["adamw"][0].parameters()),
        "steps_per_round": args.steps, "rounds": args.rounds,
        "ms_per_step": {n: [t * 1e3 for t in times[n]] for n in order},
        "optimizer_step_ms": {n: [t * 1e3 for t in alone[n]] for n in order},
        "step_ratio_muon_over_adamw": ratios,
        "step_overhead_median": statistics.median(ratios) - 1,
        "step_overhead_range": [min(ratios) - 1, max(ratios) - 1],
        "optimizer_step_extra_ms_median": statistics.median(
            m - a for m, a in zip(alone["muon"], alone["adamw"], strict=True)) * 1e3,
    }
    print(f"\nMuon / AdamW step time: median {statistics.median(ratios):.3f} "
          f"(range {min(ratios):.3f}-{max(ratios):.3f} over {args.rounds} rounds); optimizer step alone: "
          f"AdamW {statistics.median(alone['adamw']) * 1e3:.1f} ms, Muon {statistics.median(alone['muon']) * 1e3:.1f} "
          f"ms; a whole AdamW step {statistics.median(times['adamw']) * 1e3:.1f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
