"""Pattention FFN against a dense GELU MLP of equal FLOPs: step time of the same transformer.

A Pattention with n tokens costs 2·d·n multiply-adds per token (scores, then weighted values), a
dense MLP with hidden width h costs 2·d·h: equal FLOPs at n = h. Both models are the same GPT stack
(pre-LayerNorm, dense attention), only the FFN differs; no biases. Measured: a training step
(forward, cross-entropy, backward, AdamW), fp32 on the CPU, interleaved rounds.

    python -m benchmarks.pattention_vs_mlp          # d=256, 6 layers, hidden = tokens = 1024, seq 256, batch 8
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from arch_plugins import registry
from arch_plugins.projections.linear import LinearProjection
from arch_plugins.projections.pattention import PattentionProjection
from benchmarks.timing import Contender, report, run_rounds, training_step
from lit.models.gpt import GPT
from lit.models.transformer import TransformerConfig


class PattentionFFNOnly(PattentionProjection):
    """Pattention for the FFN only; q, k, v and the output stay dense, so only the FFN differs."""

    linear = LinearProjection.linear
    fused = LinearProjection.fused


def build(args, ffn: str) -> GPT:
    common = dict(d_model=args.d, n_layers=args.layers, n_heads=args.heads, norm="layernorm", bias=False)
    if ffn == "mlp":
        arch = TransformerConfig(mlp="gelu", mlp_hidden=args.hidden, projection="linear", **common)
    else:
        arch = TransformerConfig(projection="pattention_ffn_only", projection_options={"tokens_ffn": args.hidden},
                                 **common)
    return GPT(args.vocab, args.seq, arch)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in [("d", 256), ("layers", 6), ("heads", 4), ("hidden", 1024), ("seq", 256), ("batch", 8),
                          ("vocab", 256), ("steps", 5), ("rounds", 5), ("warmup", 2)]:
        p.add_argument(f"--{name}", type=int, default=default)
    args = p.parse_args(argv)
    registry.register("projection", "pattention_ffn_only", PattentionFFNOnly, package="benchmarks")
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(args.vocab, (args.batch, args.seq + 1), generator=g)
    loss = lambda m: F.cross_entropy(m(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten())
    torch.manual_seed(0)
    pat, mlp = build(args, "pattention"), build(args, "mlp")
    contenders = [Contender("pattention", pat, training_step(pat, loss)),
                  Contender("mlp", mlp, training_step(mlp, loss))]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, fp32 CPU; d {args.d}, "
          f"{args.layers} layers, FFN tokens = MLP hidden = {args.hidden}, seq {args.seq}, batch {args.batch}")
    run_rounds(contenders, args.batch * args.seq, args.steps, args.rounds, args.warmup, "tok/s")
    ratios = report(contenders, "tok/s")
    print(f"step time pattention / mlp = {1 / ratios['pattention/mlp']:.3f}")
    return ratios


if __name__ == "__main__":
    main()
