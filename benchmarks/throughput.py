"""Training throughput of our GPT baseline against a plain SDPA stack and x-transformers.

What it measures: tokens per second of one training step -- forward, cross-entropy loss, backward,
AdamW step, zero_grad -- in fp32 on the CPU, for three models of the same architecture built in one
process:

* ``ours``: ``lit.models.GPT`` with the rmsnorm / add / linear plugins and RoPE (the baseline).
* ``plain``: a minimal block stack written below with no plugin indirection (the floor our
  plumbing should come close to).
* ``x-transformers``: ``TransformerWrapper`` + ``Decoder`` with ``attn_flash=True`` (SDPA).

All three are pre-RMSNorm, full-head RoPE, causal SDPA, SwiGLU with the same hidden width
(``TransformerConfig.resolved_mlp_hidden()``), no biases, a final norm and an untied LM head, so
their parameter counts agree (printed; a warning is printed if they differ by more than 1%).

Protocol (``benchmarks/timing.py``, shared by the benchmarks): each model gets ``--warmup`` untimed steps,
then ``--rounds`` rounds in which every model runs ``--steps`` timed steps in turn (the order rotates each
round), so machine noise hits all models alike. The reported figure is the median over rounds; the ratios are
ours / other, so a ratio below 1 means ours is slower. ``torch.set_num_threads`` is left at its default.

Run from the repository root::

    pip install -e ".[bench]"        # x-transformers lives in the optional bench extra
    python benchmarks/throughput.py  # defaults: d=256, 6 layers, 4 heads, seq 256, batch 8, vocab 256
    python benchmarks/throughput.py --steps 10 --rounds 3 --json throughput.json

Without x-transformers installed, that model is skipped with a note.

``--residuals attnres attnres_block hyperconn hyperconn_static`` adds ours with each of those residual types (default
options) as further contenders, and prints each one's step time over the baseline's, per round (the two ran in the
same round, minutes apart at most) with the median and the range over rounds; ``--no-peers`` leaves out the plain
stack and x-transformers::

    python benchmarks/throughput.py --no-peers --residuals attnres attnres_block hyperconn hyperconn_static
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: benchmarks/ is not a package

from benchmarks.timing import interleave, timed  # noqa: E402
from lit.models import GPT, TransformerConfig  # noqa: E402

OURS, PLAIN, XT = "ours", "plain", "x-transformers"


# --------------------------------------------------------------------------- plain SDPA stack


class PlainRoPE(nn.Module):
    """Rotate-half RoPE over the whole head (same layout and base as lit.models.rope)."""

    def __init__(self, head_dim: int, max_len: int, base: float = 10000.0):
        super().__init__()
        inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        angles = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)
        angles = torch.cat([angles, angles], dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[-2]
        x1, x2 = x.chunk(2, dim=-1)
        return x * self.cos[:T] + torch.cat([-x2, x1], dim=-1) * self.sin[:T]


class PlainBlock(nn.Module):
    def __init__(self, d: int, n_heads: int, hidden: int):
        super().__init__()
        self.n_heads, self.hidden = n_heads, hidden
        self.norm1 = nn.RMSNorm(d, eps=1e-6)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.norm2 = nn.RMSNorm(d, eps=1e-6)
        self.up = nn.Linear(d, 2 * hidden, bias=False)  # value | gate in one matmul
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x: torch.Tensor, rope: PlainRoPE) -> torch.Tensor:
        B, T, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(B, T, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(rope(q), rope(k), v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, d))
        value, gate = self.up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(value * F.silu(gate))


class PlainGPT(nn.Module):
    def __init__(self, vocab: int, max_len: int, d: int, n_layers: int, n_heads: int, hidden: int,
                 init_std: float = 0.02):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.rope = PlainRoPE(d // n_heads, max_len)
        self.blocks = nn.ModuleList(PlainBlock(d, n_heads, hidden) for _ in range(n_layers))
        self.norm = nn.RMSNorm(d, eps=1e-6)
        self.head = nn.Linear(d, vocab, bias=False)
        # Same init as ours (GPT-2 style, depth-scaled output projections); irrelevant to speed.
        for name, p in self.named_parameters():
            if p.dim() == 2:
                scaled = name.endswith(("proj.weight", "down.weight"))
                nn.init.normal_(p, std=init_std / math.sqrt(2 * n_layers) if scaled else init_std)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx)
        for block in self.blocks:
            x = block(x, self.rope)
        return self.head(self.norm(x))


# --------------------------------------------------------------------------- model builders


def build_ours(args: argparse.Namespace, norm: str = "rmsnorm", residual: str = "add") -> tuple[nn.Module, int]:
    arch = TransformerConfig(d_model=args.d_model, n_layers=args.layers, n_heads=args.heads, mlp="swiglu",
                             norm=norm, residual=residual, projection="linear", positions="rope")
    return GPT(vocab_size=args.vocab, block_size=args.seq, arch=arch), arch.resolved_mlp_hidden()


def build_plain(args: argparse.Namespace, hidden: int) -> nn.Module:
    return PlainGPT(args.vocab, args.seq, args.d_model, args.layers, args.heads, hidden)


def import_x_transformers():
    """The x_transformers module, or None when the optional bench extra is not installed."""
    try:
        with warnings.catch_warnings():  # it imports torch.jit.script helpers that warn on recent torch
            warnings.simplefilter("ignore", FutureWarning)
            import x_transformers
    except ImportError:
        return None
    return x_transformers


def build_x_transformers(xt, args: argparse.Namespace, hidden: int) -> nn.Module:
    head_dim = args.d_model // args.heads
    model = xt.TransformerWrapper(
        num_tokens=args.vocab,
        max_seq_len=args.seq,
        use_abs_pos_emb=False,          # RoPE only
        tie_embedding=False,            # untied head, like ours
        attn_layers=xt.Decoder(
            dim=args.d_model,
            depth=args.layers,
            heads=args.heads,
            attn_dim_head=head_dim,
            attn_flash=True,            # F.scaled_dot_product_attention
            rotary_pos_emb=True,
            rotary_emb_dim=head_dim,    # full-head rotary (the default rotates only half the head)
            use_rmsnorm=True,           # pre-norm is the default; RMSNorm instead of LayerNorm
            ff_glu=True,
            ff_swish=True,              # SwiGLU
            ff_mult=hidden / args.d_model,  # inner dim = int(dim * mult) = our hidden width
            ff_no_bias=True,
        ),
    )
    # The GLU up-projection always carries a bias (ff_no_bias only reaches the down-projection);
    # drop it so the model matches ours exactly. nn.Linear.forward accepts bias=None.
    glus = [m for m in model.modules() if type(m).__name__ == "GLU"]
    for glu in glus:
        if glu.proj.out_features != 2 * hidden:
            raise RuntimeError(f"x-transformers GLU width {glu.proj.out_features // 2} != our hidden {hidden}")
        glu.proj.register_parameter("bias", None)
    if len(glus) != args.layers:
        raise RuntimeError(f"expected {args.layers} GLU feed-forwards in x-transformers, found {len(glus)}")
    return model


# --------------------------------------------------------------------------- measurement


@dataclass
class Bench:
    name: str
    model: nn.Module
    step: Callable[[], None]
    params: int
    tokens_per_s: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.tokens_per_s)


def make_step(model: nn.Module, idx: torch.Tensor, targets: torch.Tensor, vocab: int) -> Callable[[], None]:
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)

    def step() -> None:
        logits = model(idx)
        loss = F.cross_entropy(logits.view(-1, vocab), targets.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--steps", type=int, default=30, help="timed steps per model per round")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the median over rounds is reported")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps per model before the first round")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--d_model", type=int, default=256)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--residuals", nargs="*", default=[], metavar="NAME",
                   help="also time ours with these residual types (default options), against ours with `add`")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    p.add_argument("--norms", nargs="*", default=[], metavar="NORM",
                   help="also time ours with these norm strategies (models 'norm=NAME'), e.g. layernorm bhyt")
    p.add_argument("--no-peers", action="store_true", help="skip the plain stack and x-transformers")
    args = p.parse_args(argv)
    if args.steps < 1 or args.rounds < 1 or args.warmup < 0:
        p.error("--steps and --rounds must be >= 1, --warmup >= 0")
    return args


def residual_overheads(benches: list[Bench]) -> dict[str, dict]:
    """Each residual variant's step time over the baseline's, per round (same round: the fairest pairing)."""
    base = benches[0].tokens_per_s
    result = {}
    for b in benches:
        if b.name.startswith(f"{OURS}+"):
            per_round = [r0 / r for r0, r in zip(base, b.tokens_per_s, strict=True)]
            result[b.name.removeprefix(f"{OURS}+")] = {"per_round": per_round, "median": statistics.median(per_round),
                                                        "min": min(per_round), "max": max(per_round)}
    return result


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    device = torch.device("cpu")
    g = torch.Generator().manual_seed(args.seed)
    idx = torch.randint(args.vocab, (args.batch, args.seq), generator=g, device=device)
    targets = torch.randint(args.vocab, (args.batch, args.seq), generator=g, device=device)
    tokens_per_step = args.batch * args.seq

    models: dict[str, nn.Module] = {}
    torch.manual_seed(args.seed)
    models[OURS], hidden = build_ours(args)
    for norm in args.norms:  # the same model with another norm strategy, timed in the same rounds
        torch.manual_seed(args.seed)
        models[f"norm={norm}"] = build_ours(args, norm)[0]
    xt = None
    if not args.no_peers:
        torch.manual_seed(args.seed)
        models[PLAIN] = build_plain(args, hidden)
        xt = import_x_transformers()
        if xt is None:
            print('note: x_transformers is not importable; skipping it (pip install -e ".[bench]")')
        else:
            torch.manual_seed(args.seed)
            models[XT] = build_x_transformers(xt, args, hidden)
    for residual in args.residuals:
        torch.manual_seed(args.seed)
        models[f"{OURS}+{residual}"] = build_ours(args, residual=residual)[0]

    benches = []
    for name, model in models.items():
        model.to(device=device, dtype=torch.float32).train()
        with torch.no_grad():
            out = model(idx[:1])
        if out.shape != (1, args.seq, args.vocab):
            raise RuntimeError(f"{name}: logits shape {tuple(out.shape)}, expected (1, {args.seq}, {args.vocab})")
        benches.append(Bench(name, model, make_step(model, idx, targets, args.vocab), count_params(model)))

    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"{torch.get_num_threads()} threads, fp32 CPU")
    print(f"d_model={args.d_model} layers={args.layers} heads={args.heads} mlp_hidden={hidden} (swiglu) "
          f"seq={args.seq} batch={args.batch} vocab={args.vocab}")
    print(f"warmup {args.warmup}, {args.rounds} rounds x {args.steps} steps per model")
    for b in benches:
        print(f"  {b.name:<15} {b.params:>12,} params")
    ref = benches[0].params
    for b in benches[1:]:
        if b.name in (PLAIN, XT) and abs(b.params - ref) / ref > 0.01:
            print(f"warning: {b.name} has {b.params:,} params, {100 * (b.params - ref) / ref:+.2f}% vs ours")

    by_name = {b.name: b for b in benches}
    rates = interleave(list(by_name), lambda name: args.steps * tokens_per_step / timed(by_name[name].step, args.steps),
                       args.rounds, warmup=lambda name: timed(by_name[name].step, args.warmup),
                       after_round=lambda r, latest: print(f"round {r + 1}/{args.rounds}: " + ", ".join(
                           f"{name} {rate:,.0f}" for name, rate in latest.items()) + " tok/s", flush=True))
    for name, values in rates.items():
        by_name[name].tokens_per_s.extend(values)

    ours = benches[0].median
    print()
    print("| model | params | tokens/s | ours / model | spread over rounds |")
    print("|---|---:|---:|---:|---:|")
    for b in benches:
        spread = (max(b.tokens_per_s) - min(b.tokens_per_s)) / b.median
        print(f"| {b.name} | {b.params / 1e6:.3f}M | {b.median:,.0f} | {ours / b.median:.3f} | {100 * spread:.1f}% |")
    ratios = {f"ours/{b.name}": ours / b.median for b in benches[1:]}
    print()
    for key, value in ratios.items():
        print(f"{key} = {value:.3f}")
    overheads = residual_overheads(benches)
    if overheads:
        print()
        print("| residual | step time / baseline's (median over rounds) | range over rounds |")
        print("|---|---:|---:|")
        for name, o in overheads.items():
            print(f"| {name} | {o['median']:.3f} | {o['min']:.3f} - {o['max']:.3f} |")

    results = {
        "config": {k: v for k, v in vars(args).items() if k != "json"} | {"mlp_hidden": hidden},
        "env": {
            "torch": torch.__version__,
            "x_transformers": metadata.version("x-transformers") if xt is not None else None,
            "threads": torch.get_num_threads(),
            "device": "cpu",
            "dtype": "float32",
            "processor": platform.processor() or platform.machine(),
        },
        "models": {b.name: {"params": b.params, "tokens_per_s": b.tokens_per_s, "median_tokens_per_s": b.median}
                   for b in benches},
        "ratios": ratios,
        "residual_step_time_ratios": overheads,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
        print(f"wrote {args.json}")
    return results


if __name__ == "__main__":
    main()
