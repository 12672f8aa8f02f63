"""Peak activation memory of a training step with the residual history recorded and not, with and without
activation checkpointing (CPU).

The stack records its ``ResidualHistory`` only where something reads it (``arch_plugins/interfaces.py``): a
residual that declares ``reads_history``, or a diagnostics probe. Before that rule every forward recorded it.
Recording it again is one context manager (``TransformerStack.recording_history``, what the probe uses), so both
are measured on one model in one process: recorded is the old behaviour, not recorded the baseline's now.

Memory is counted by the allocator, not estimated: the step (forward, cross-entropy, backward) runs under
``torch.profiler`` with ``profile_memory=True``, and the running sum of every allocation and free it records gives
the peak bytes above what was alive before the step (parameters excluded; the gradients, made in backward,
included). Exact and repeatable on CPU; a device's caching allocator would round each block up.

    python -m benchmarks.activation_memory                     # d 256, 8 layers, 8 x 256 tokens
    python -m benchmarks.activation_memory --json benchmarks/results/activation_memory.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from lit.models import GPT, TransformerConfig
from lit.parallel import checkpoint_blocks


def peak_bytes(step) -> int:
    """The most bytes allocated at once during ``step()`` above what was allocated when it started."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]")
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--d_model", type=int, default=256)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    model = GPT(args.vocab, args.seq, TransformerConfig(d_model=args.d_model, n_layers=args.layers,
                                                        n_heads=args.heads))
    x = torch.randint(0, args.vocab, (args.batch, args.seq))

    def step() -> None:
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(x).flatten(0, 1), x.flatten()).backward()

    rows = []
    print("| activation checkpointing | history recorded (before) MiB | not recorded (now) MiB | saved |\n"
          "|---|---:|---:|---:|")
    for checkpointing in (False, True):
        if checkpointing:
            checkpoint_blocks(model)
        step()  # warm: the first step allocates what later ones reuse (none on CPU, but cheap to rule out)
        measured = {}
        for recorded in (True, False):
            model.zero_grad(set_to_none=True)
            with model.stack.recording_history() if recorded else contextlib.nullcontext():
                measured[recorded] = peak_bytes(step)
        before, after = measured[True], measured[False]
        rows.append({"activation_checkpointing": checkpointing, "recorded_bytes": before, "not_recorded_bytes": after})
        print(f"| {'on' if checkpointing else 'off'} | {before / 2**20:.1f} | {after / 2**20:.1f} | "
              f"{1 - after / before:.0%} |")
    out = {"torch": torch.__version__, **{k: v for k, v in vars(args).items() if k != "json"}, "results": rows}
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
