"""Peak memory of the training loss with the whole fp32 logits and read out in chunks (lit/readout_loss.py), on CPU.

Two measurements at a GPT-2 vocabulary (50,304) and a micro-batch of a few thousand tokens:

1. the loss alone: the head's input (tokens x d_model, requiring grad) through the model's readout, cross-entropy
   in fp32, backward; the whole-logits path as ``LanguageModel`` computed it before (``F.cross_entropy`` of
   ``logits.float()``) against ``readout_loss`` at the default chunk budget (``loss_chunk_mib`` 256);
2. a whole training step (forward, loss, backward) of a small GPT at the same vocabulary and tokens.

Memory is counted by the allocator (``benchmarks.activation_memory.peak_bytes``: ``torch.profiler``'s allocation
records, summed in time order), as the most bytes alive at once above what was alive when the step began. Exact and
repeatable on CPU (the run prints both repeats); a GPU's caching allocator would round each block up. It also
checks that both paths give the same loss.

    python -m benchmarks.memory                                  # 4 x 1024 tokens, vocabulary 50,304, d 256
    python -m benchmarks.memory --json benchmarks/results/memory.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.activation_memory import peak_bytes
from lit.models import GPT, TransformerConfig
from lit.readout_loss import chunk_tokens, readout_loss

DEFAULT_CHUNK_MIB = 256.0  # LanguageModel's loss_chunk_mib default


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--d_model", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--chunk_mib", type=float, default=DEFAULT_CHUNK_MIB)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    model = GPT(args.vocab, args.seq, TransformerConfig(d_model=args.d_model, n_layers=args.layers, n_heads=4))
    idx = torch.randint(0, args.vocab, (args.batch, args.seq))
    targets = torch.randint(0, args.vocab, (args.batch, args.seq))
    hidden = torch.randn(args.batch, args.seq, args.d_model).requires_grad_()
    chunk = chunk_tokens(args.vocab, args.chunk_mib)
    losses = {}

    def loss_alone(chunked: bool):
        def step() -> None:
            model.zero_grad(set_to_none=True)
            hidden.grad = None
            if chunked:
                loss = readout_loss(model.readout, hidden, targets, chunk)[0]
            else:
                loss = F.cross_entropy(model.readout(hidden).flatten(0, 1).float(), targets.flatten())
            loss.backward()
            losses[("loss", chunked)] = loss.item()
        return step

    def training_step(chunked: bool):
        def step() -> None:
            model.zero_grad(set_to_none=True)
            if chunked:
                loss = readout_loss(model.readout, model(idx, readout=False), targets, chunk)[0]
            else:
                loss = F.cross_entropy(model(idx).flatten(0, 1).float(), targets.flatten())
            loss.backward()
            losses[("step", chunked)] = loss.item()
        return step

    tokens = args.batch * args.seq
    logits_bytes = tokens * args.vocab * 4
    print(f"vocabulary {args.vocab}, {args.batch} x {args.seq} = {tokens} tokens, d_model {args.d_model}: fp32 "
          f"logits {logits_bytes / 2**20:.0f} MiB whole; chunks of {chunk} tokens "
          f"({chunk * args.vocab * 4 / 2**20:.0f} MiB)\n")
    print("| what | whole fp32 logits (MiB) | chunked (MiB) | chunked / whole |\n|---|---:|---:|---:|")
    rows = []
    for what, make in (("loss alone", loss_alone), (f"training step ({args.layers} layers)", training_step)):
        make(False)()  # warm: anything allocated once (lazy state) stays out of the figures
        make(True)()
        whole = [peak_bytes(make(False)) for _ in range(args.repeats)]
        chunked = [peak_bytes(make(True)) for _ in range(args.repeats)]
        rows.append({"what": what, "whole_bytes": whole, "chunked_bytes": chunked})
        print(f"| {what} | {max(whole) / 2**20:.0f} | {max(chunked) / 2**20:.0f} | "
              f"{max(chunked) / max(whole):.2f} |")
    for kind in ("loss", "step"):
        assert abs(losses[(kind, True)] - losses[(kind, False)]) <= 1e-5 * abs(losses[(kind, False)]), losses
    print(f"\nrepeats (bytes): {[(r['whole_bytes'], r['chunked_bytes']) for r in rows]}; losses equal within 1e-5: "
          f"{losses[('loss', False)]:.6f} vs {losses[('loss', True)]:.6f}")
    result = {"vocab": args.vocab, "tokens": tokens, "d_model": args.d_model, "chunk_tokens": chunk,
              "logits_bytes": logits_bytes, "rows": rows, "torch": torch.__version__}
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
