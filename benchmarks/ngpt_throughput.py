"""Training throughput of our nGPT against nGPT-pytorch and against our GPT baseline, and the renormalisation cost.

What it measures: tokens per second of one training step -- forward, cross-entropy, backward, AdamW step,
zero_grad, and the unit-norm renormalisation where the model needs one -- in fp32 on the CPU, one process,
for models built in one process from the same config (default d=256, 6 layers, 4 heads, seq 256, batch 8,
vocab 256):

* ``ours nGPT``: ``lit.models.GPT`` with the hypersphere / ngpt plugins, SwiGLU hidden 704, untied head;
  each step ends with ``renormalize_`` (what the ``RenormalizeUnitNormWeights`` callback runs).
* ``ours GPT``: the baseline, rmsnorm / add / linear, same widths (the reference for "nGPT vs GPT step time").
* ``nGPT-pytorch``: ``nGPT_pytorch.nGPT`` 0.2.16 as published (weights normalised by ``parametrize`` in
  every forward), configured to the same architecture: hidden 704 (``ff_expand_factor`` 4.125),
  ``add_value_residual=False``, untied embeddings, q/k norm on.
* ``nGPT-pytorch manual``: the same with ``manual_norm_weights=True`` and ``norm_weights_()`` after each
  step (NVIDIA's step-then-retract scheme, like ours).

Protocol as ``benchmarks/throughput.py`` (``benchmarks/timing.py``'s loop): warmup, then interleaved rounds with a
rotating order; the median over rounds is reported. The renormalisation's own cost is timed separately (median
of many calls).

    pip install -e ".[bench]"
    python benchmarks/ngpt_throughput.py --rounds 7 --steps 15
    python benchmarks/ngpt_throughput.py --cpu_time --rounds 3 --steps 3   # on a busy shared machine
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from arch_plugins.constraints import renormalize_  # noqa: E402
from benchmarks.ngpt_pytorch_peer import import_ngpt_pytorch  # noqa: E402
from benchmarks.throughput import Bench, count_params  # noqa: E402
from benchmarks.timing import interleave, timed  # noqa: E402
from lit.models import GPT, TransformerConfig  # noqa: E402

OURS_NGPT, OURS_GPT, LUC, LUC_MANUAL = "ours nGPT", "ours GPT", "nGPT-pytorch", "nGPT-pytorch manual"


def build_ours(args: argparse.Namespace, norm: str, residual: str) -> tuple[GPT, int]:
    arch = TransformerConfig(d_model=args.d_model, n_layers=args.layers, n_heads=args.heads, mlp="swiglu",
                             norm=norm, residual=residual, init_std=args.d_model ** -0.5)
    return GPT(vocab_size=args.vocab, block_size=args.seq, arch=arch), arch.resolved_mlp_hidden()


def build_ngpt_pytorch(package, args: argparse.Namespace, hidden: int, manual: bool) -> nn.Module:
    factor = hidden * 3 / (2 * args.d_model)  # its hidden width is int(dim * factor * 2/3)
    model = package.nGPT(num_tokens=args.vocab, dim=args.d_model, depth=args.layers, heads=args.heads,
                         dim_head=args.d_model // args.heads, attn_norm_qk=True, ff_expand_factor=factor,
                         add_value_residual=False, alpha_init=0.05, tied_embedding=False,
                         manual_norm_weights=manual)
    width = model.layers[0][1].fn.dim_inner
    if width != hidden:
        raise RuntimeError(f"nGPT-pytorch hidden width {width} != ours {hidden}")
    return model


def make_step(model: nn.Module, idx: torch.Tensor, targets: torch.Tensor, vocab: int,
              after_step: Callable[[], object] | None) -> Callable[[], None]:
    # The recipe's optimizer: AdamW without weight decay (nGPT's), same for every model.
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)

    def step() -> None:
        logits = model(idx)
        loss = F.cross_entropy(logits.view(-1, vocab), targets.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if after_step is not None:
            after_step()

    return step


CLOCK = time.perf_counter  # --cpu_time switches to time.process_time


def median_ms(fn: Callable[[], object], n: int) -> float:
    times = []
    for _ in range(n):
        start = CLOCK()
        fn()
        times.append(CLOCK() - start)
    return 1e3 * statistics.median(times)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--steps", type=int, default=15, help="timed steps per model per round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--d_model", type=int, default=256)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cpu_time", action="store_true",
                   help="one thread, and this process's CPU time instead of wall time: robust to other processes "
                        "on a shared machine (the figures are then per-core, not the machine's throughput)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    args = p.parse_args(argv)
    if args.steps < 1 or args.rounds < 1 or args.warmup < 0:
        p.error("--steps and --rounds must be >= 1, --warmup >= 0")
    return args


def main(argv: list[str] | None = None) -> dict:
    global CLOCK
    args = parse_args(argv)
    if args.cpu_time:
        torch.set_num_threads(1)
        CLOCK = time.process_time
    g = torch.Generator().manual_seed(args.seed)
    idx = torch.randint(args.vocab, (args.batch, args.seq), generator=g)
    targets = torch.randint(args.vocab, (args.batch, args.seq), generator=g)
    tokens_per_step = args.batch * args.seq

    torch.manual_seed(args.seed)
    ours_ngpt, hidden = build_ours(args, "hypersphere", "ngpt")
    renormalize_(ours_ngpt)
    torch.manual_seed(args.seed)
    ours_gpt, _ = build_ours(args, "rmsnorm", "add")
    package = import_ngpt_pytorch()
    torch.manual_seed(args.seed)
    luc = build_ngpt_pytorch(package, args, hidden, manual=False)
    torch.manual_seed(args.seed)
    luc_manual = build_ngpt_pytorch(package, args, hidden, manual=True)

    benches = [
        Bench(OURS_NGPT, ours_ngpt, make_step(ours_ngpt, idx, targets, args.vocab, lambda: renormalize_(ours_ngpt)),
              count_params(ours_ngpt)),
        Bench(OURS_GPT, ours_gpt, make_step(ours_gpt, idx, targets, args.vocab, None), count_params(ours_gpt)),
        Bench(LUC, luc, make_step(luc, idx, targets, args.vocab, None), count_params(luc)),
        Bench(LUC_MANUAL, luc_manual, make_step(luc_manual, idx, targets, args.vocab, luc_manual.norm_weights_),
              count_params(luc_manual)),
    ]
    for b in benches:
        b.model.train()

    print(f"torch {torch.__version__}, ngpt-pytorch {metadata.version('ngpt-pytorch')}, "
          f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, fp32 CPU, "
          f"{'CPU time' if args.cpu_time else 'wall time'}")
    print(f"d_model={args.d_model} layers={args.layers} heads={args.heads} mlp_hidden={hidden} (swiglu) "
          f"seq={args.seq} batch={args.batch} vocab={args.vocab}")
    for b in benches:
        print(f"  {b.name:<20} {b.params:>12,} params")

    by_name = {b.name: b for b in benches}
    rates = interleave(list(by_name),
                       lambda name: args.steps * tokens_per_step / timed(by_name[name].step, args.steps, CLOCK),
                       args.rounds, warmup=lambda name: timed(by_name[name].step, args.warmup, CLOCK),
                       after_round=lambda r, latest: print(f"round {r + 1}/{args.rounds}: " + ", ".join(
                           f"{name} {rate:,.0f}" for name, rate in latest.items()) + " tok/s", flush=True))
    for name, values in rates.items():
        by_name[name].tokens_per_s.extend(values)

    renorm_ms = median_ms(lambda: renormalize_(ours_ngpt), 50)
    luc_renorm_ms = median_ms(luc_manual.norm_weights_, 50)
    ours = by_name[OURS_NGPT].median
    step_ms = 1e3 * tokens_per_step / ours
    ratios = {
        "ours nGPT / nGPT-pytorch (throughput)": ours / by_name[LUC].median,
        "ours nGPT / nGPT-pytorch manual (throughput)": ours / by_name[LUC_MANUAL].median,
        "ours nGPT / ours GPT (step time)": by_name[OURS_GPT].median / ours,
    }
    print()
    print("| model | params | tokens/s | step (ms) |")
    print("|---|---:|---:|---:|")
    for b in benches:
        print(f"| {b.name} | {b.params / 1e6:.3f}M | {b.median:,.0f} | {1e3 * tokens_per_step / b.median:.0f} |")
    print()
    for key, value in ratios.items():
        print(f"{key} = {value:.3f}")
    print(f"renormalisation: {renorm_ms:.2f} ms per step ({100 * renorm_ms / step_ms:.1f}% of the nGPT step); "
          f"nGPT-pytorch norm_weights_: {luc_renorm_ms:.2f} ms")

    results = {
        "config": {k: v for k, v in vars(args).items() if k != "json"} | {"mlp_hidden": hidden},
        "env": {"torch": torch.__version__, "ngpt_pytorch": metadata.version("ngpt-pytorch"),
                "threads": torch.get_num_threads(), "device": "cpu", "dtype": "float32",
                "clock": "process_time (CPU time)" if args.cpu_time else "perf_counter (wall)"},
        "models": {b.name: {"params": b.params, "tokens_per_s": b.tokens_per_s, "median_tokens_per_s": b.median}
                   for b in benches},
        "ratios": ratios,
        "renormalize_ms": renorm_ms,
        "ngpt_pytorch_norm_weights_ms": luc_renorm_ms,
        "ngpt_step_ms": step_ms,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
        print(f"wrote {args.json}")
    return results


if __name__ == "__main__":
    main()
