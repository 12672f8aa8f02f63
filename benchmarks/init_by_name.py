"""What ``--model.random_numbers by_name`` costs a training step, against ``construction_order``.

The two rules build the same architecture; ``by_name`` also installs ``RuntimeStreams`` (on every module that may
draw, a forward pre-hook that reseeds the generator from the module's path and the batch and a forward hook that
hands the caller's stream back, ``lit/common_random_numbers.py``) and keys each batch. Those per-call hooks are the
only difference a training step sees, so the two step times
should agree: the goal is at most 2% apart.

Two sizes: ``micro`` (2 layers, d 32, 4 x 32 tokens: a step is a few ms, so a per-module cost shows most) and
``reproduction`` (the reproduction suite's text model: 8 layers, d 128, 4 heads, 16 x 64 tokens, vocabulary 65).
A step: forward, cross-entropy, backward, AdamW step, zero_grad, as a sweep child's fit runs it (less Lightning).

Protocol (``benchmarks/timing.py``): in one process, untimed warmup steps for each, then ``--rounds`` rounds in
which both rules run ``--steps`` timed steps in turn, the order alternating per round. Reported per size: the
median over rounds of the per-round ratio (by_name step time / construction_order step time) with its range.

Lightning is imported first because the runs import it: it sets ``PYTORCH_NVML_BASED_CUDA_CHECK=1``, under which
an uncached ``torch.cuda.is_available()`` asks the NVML library on every call.

    python -m benchmarks.init_by_name                      # both sizes, CPU
    python -m benchmarks.init_by_name --sizes micro --rounds 9
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import lightning  # noqa: F401  (sets PYTORCH_NVML_BASED_CUDA_CHECK as every run does)
import torch
import torch.nn.functional as F

from benchmarks.timing import interleave, timed
from lit.common_random_numbers import BY_NAME, CONSTRUCTION_ORDER, RuntimeStreams, build
from lit.models import GPT, TransformerConfig

SIZES = {  # layers, d_model, heads, batch, sequence, vocabulary
    "micro": dict(layers=2, d_model=32, heads=4, batch=4, seq=32, vocab=65),
    "reproduction": dict(layers=8, d_model=128, heads=4, batch=16, seq=64, vocab=65),
}
RULES = (CONSTRUCTION_ORDER, BY_NAME)
# cpu: this process's CPU time, which other processes on a shared machine disturb far less than wall time (the hook
# costs CPU time only: nothing in it waits); wall: for a machine of one's own, or a device.
CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}


def contender(rule: str, size: dict, seed: int):
    """A step function for one rule: the model built under it, and for by_name the runtime streams as a fit
    installs them (``lit/task.py``'s ``on_train_start``) and keys (``on_train_batch_start``)."""
    cfg = TransformerConfig(d_model=size["d_model"], n_layers=size["layers"], n_heads=size["heads"])
    torch.manual_seed(seed)
    model = build(lambda: GPT(size["vocab"], size["seq"], cfg), rule, seed)
    model.train()
    streams = RuntimeStreams(model, seed) if rule == BY_NAME else None
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    g = torch.Generator().manual_seed(seed)
    x, y = (torch.randint(0, size["vocab"], (size["batch"], size["seq"]), generator=g) for _ in range(2))
    batch = [0]

    def step() -> None:
        if streams is not None:
            streams.start_batch(batch[0])
        batch[0] += 1
        logits = model(x)
        F.cross_entropy(logits.flatten(0, 1), y.flatten()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def measure(size_name: str, args) -> dict:
    size = SIZES[size_name]
    steps = {rule: contender(rule, size, args.seed) for rule in RULES}
    clock = CLOCKS[args.clock]
    times = interleave(list(RULES), lambda rule: timed(steps[rule], args.steps, clock) / args.steps, args.rounds,
                       warmup=lambda rule: timed(steps[rule], args.warmup))
    ratios = [b / c for b, c in zip(times[BY_NAME], times[CONSTRUCTION_ORDER], strict=True)]
    out = {"size": size_name, **size, "clock": args.clock,
           "ms_per_step": {r: [t * 1e3 for t in times[r]] for r in RULES},
           "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios)}
    print(f"{size_name}: construction_order {statistics.median(times[CONSTRUCTION_ORDER]) * 1e3:.2f} ms/step, "
          f"by_name {statistics.median(times[BY_NAME]) * 1e3:.2f} ms/step; by_name / construction_order "
          f"median {out['ratio_median']:.3f} (range {out['ratio_min']:.3f}-{out['ratio_max']:.3f}, "
          f"{args.rounds} rounds of {args.steps} steps, {args.clock} time)", flush=True)
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", nargs="+", choices=list(SIZES), default=list(SIZES))
    p.add_argument("--steps", type=int, default=None, help="timed steps per rule per round (default: 40 micro, "
                                                           "8 reproduction)")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--clock", choices=list(CLOCKS), default="cpu")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = p.parse_args(argv)
    results = []
    for size_name in args.sizes:
        sized = argparse.Namespace(**{**vars(args), "steps": args.steps or (40 if size_name == "micro" else 8)})
        results.append(measure(size_name, sized))
    out = {"torch": torch.__version__, "machine": platform.machine(), "cpus": os.cpu_count(),
           "threads": torch.get_num_threads(), "results": results}
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
