"""Sampling speed with and without the KV cache: ``GPT.generate`` greedy, in one process, interleaved rounds.

    python -m benchmarks.kv_cache                                   # the default stack (rmsnorm, add, linear)
    python -m benchmarks.kv_cache --norm hypersphere --residual ngpt

One model (eval mode, random weights), one prompt; each round generates ``--new-tokens`` tokens with the cache and
without it, the order alternating (``benchmarks/timing.interleave``), so machine noise hits both alike. Prints
tokens/s per round, the medians and min-max, the ratio of the medians and the per-round ratios; checks that both
produced the same tokens. The sequence stays within block_size (past it, generate recomputes the sliding window in
both modes).
Figures: docs/bpe-track.md ("Sampling with a KV cache").
"""

from __future__ import annotations

import argparse
import statistics

import torch

from benchmarks.timing import interleave, timed
from lit.models.gpt import GPT
from lit.models.transformer import TransformerConfig


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """The random-weight model the decoding benchmarks time (this one and ``benchmarks.batched_generation``)."""
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--block-size", type=int, default=256)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_arguments(p)
    p.add_argument("--prompt", type=int, default=16, help="prompt length in tokens")
    p.add_argument("--new-tokens", type=int, default=240)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--norm", default="rmsnorm")
    p.add_argument("--residual", default="add")
    p.add_argument("--projection", default="linear")
    a = p.parse_args()
    if a.prompt + a.new_tokens > a.block_size:
        p.error("prompt + new tokens must fit block_size (past it both modes recompute the window)")

    torch.manual_seed(0)
    arch = TransformerConfig(d_model=a.d_model, n_layers=a.layers, n_heads=a.heads, norm=a.norm,
                             residual=a.residual, projection=a.projection)
    model = GPT(a.vocab, a.block_size, arch).eval()
    prompt = torch.randint(0, a.vocab, (1, a.prompt))
    outputs: dict[str, torch.Tensor] = {}

    def run(name: str) -> None:
        outputs[name] = model.generate(prompt, a.new_tokens, temperature=0, use_cache=name == "cache")

    rates = interleave(["cache", "no cache"], lambda name: a.new_tokens / timed(lambda: run(name), 1), a.rounds,
                       warmup=run, after_round=lambda r, latest: print(
                           f"round {r + 1}/{a.rounds}: " + ", ".join(f"{n} {v:,.1f}" for n, v in latest.items())
                           + " tokens/s", flush=True))
    assert torch.equal(outputs["cache"], outputs["no cache"]), "the cached and uncached tokens differ"
    median = {name: statistics.median(values) for name, values in rates.items()}
    print(f"\n{a.norm}/{a.residual}/{a.projection}, d {a.d_model}, {a.layers} layers, vocab {a.vocab}, prompt "
          f"{a.prompt} + {a.new_tokens} new tokens, batch 1, {torch.get_num_threads()} threads, {a.rounds} rounds")
    for name, values in rates.items():
        print(f"{name}: median {median[name]:,.1f} tokens/s (min {min(values):,.1f}, max {max(values):,.1f})")
    # Each round's two runs are neighbours in time, so their ratio cancels most of the load that moves between rounds.
    paired = [c / n for c, n in zip(rates["cache"], rates["no cache"], strict=True)]
    print(f"cache / no cache: {median['cache'] / median['no cache']:.2f}x (ratio of medians); per round: median "
          f"{statistics.median(paired):.2f}x, min {min(paired):.2f}x, max {max(paired):.2f}x; same tokens: yes")


if __name__ == "__main__":
    main()
