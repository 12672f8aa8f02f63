"""Greedy generation for many prompts (what lm-eval's ``generate_until`` asks): left-padded batches against one
prompt at a time, both through the KV cache, in one process, interleaved rounds.

    python -m benchmarks.batched_generation                 # 32 prompts of 8-96 tokens, 32 new tokens each
    python -m benchmarks.batched_generation --batch-size 16

One model (eval mode, random weights) and one set of prompts of different lengths; each round decodes all of them
with ``SequenceScorer.greedy_batch`` at ``--batch-size`` and at batch size 1, the order alternating
(``benchmarks/timing.interleave``). Prints new tokens/s per round, the medians and the per-round ratio, and checks
that both produced the same tokens. Figures: docs/bpe-track.md ("Score downstream tasks").
"""

from __future__ import annotations

import argparse
import statistics

import torch

from benchmarks.kv_cache import add_model_arguments
from benchmarks.timing import interleave, timed
from lit.evaluation.scoring import SequenceScorer
from lit.models.gpt import GPT
from lit.models.transformer import TransformerConfig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_arguments(p)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--shortest", type=int, default=8)
    p.add_argument("--longest", type=int, default=96)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    if a.longest + a.new_tokens > a.block_size:
        p.error("the longest prompt plus the new tokens must fit block_size")

    torch.manual_seed(0)
    model = GPT(a.vocab, a.block_size, TransformerConfig(d_model=a.d_model, n_layers=a.layers, n_heads=a.heads))
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(a.shortest, a.longest + 1, (a.prompts,), generator=g).tolist()
    prompts = [torch.randint(0, a.vocab, (n,), generator=g).tolist() for n in lengths]
    scorers = {"batched": SequenceScorer(model, a.block_size, batch_size=a.batch_size),
               "one at a time": SequenceScorer(model, a.block_size, batch_size=1)}
    outputs: dict[str, list[list[int]]] = {}

    def run(name: str) -> None:
        outputs[name] = scorers[name].greedy_batch(prompts, a.new_tokens)

    new_tokens = a.prompts * a.new_tokens
    rates = interleave(list(scorers), lambda name: new_tokens / timed(lambda: run(name), 1), a.rounds,
                       warmup=run, after_round=lambda r, latest: print(
                           f"round {r + 1}/{a.rounds}: " + ", ".join(f"{n} {v:,.1f}" for n, v in latest.items())
                           + " new tokens/s", flush=True))
    assert outputs["batched"] == outputs["one at a time"], "batched and one-at-a-time tokens differ"
    median = {name: statistics.median(values) for name, values in rates.items()}
    print(f"\nd {a.d_model}, {a.layers} layers, vocab {a.vocab}, {a.prompts} prompts of {a.shortest}-{a.longest} "
          f"tokens + {a.new_tokens} new, batch {a.batch_size}, {torch.get_num_threads()} threads, {a.rounds} rounds")
    for name, values in rates.items():
        print(f"{name}: median {median[name]:,.1f} new tokens/s (min {min(values):,.1f}, max {max(values):,.1f})")
    paired = [b / s for b, s in zip(rates["batched"], rates["one at a time"], strict=True)]
    print(f"batched / one at a time: {median['batched'] / median['one at a time']:.2f}x (ratio of medians); per "
          f"round: median {statistics.median(paired):.2f}x, min {min(paired):.2f}x, max {max(paired):.2f}x; same "
          f"tokens: yes")


if __name__ == "__main__":
    main()
