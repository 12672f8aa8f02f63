"""What a sweep child pays to compile its model, cold (the variant's first child) and warm (the others), on CPU.

    python -m benchmarks.compile_cache                 # 3 paired rounds at the reproduction's text size
    python -m benchmarks.compile_cache --rounds 5 --layers 4

A sweep's children share one Inductor cache (``lit/sweep/compile_cache.py``). Each round makes a fresh sweep
folder and runs two children in it, one after the other, each a fresh process that does what a child's fit does
with ``--model.compile=true``: set the sweep's cache (``compile_cache.use``, as ``lit/sweep/child.py`` does), build
the GPT, compile it with ``lit.parallel.compile_model``, take a training step through the task's loss
(``readout_loss``), then an evaluation forward (validation's graph). The first child finds the cache empty (cold),
the second finds the first's graphs (warm). Per child:

- **compile s**: the first training step plus the first evaluation forward, less a steady training step and a
  steady evaluation forward measured after them: the time tracing, Inductor and the C++ builds add;
- the cache's counters (FX graph and AOTAutograd hits and misses), so a warm child is shown to have hit;
- **process s**: the child's whole wall time, imports included, for scale.

Rounds pair a cold and a warm child on the same machine minutes apart, so load hits both alike; the ratio is taken
per round and its median and range printed. Figures: docs/performance/compile-cache.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VOCAB = 65  # tinyshakespeare's characters


def child(sweep_folder: Path, out: Path, layers: int, d_model: int, batch: int, block: int) -> None:
    started = time.perf_counter()
    from lit.sweep import compile_cache

    compile_cache.use(sweep_folder)  # what lit/sweep/child.py does before a child's fit
    import torch
    from torch._dynamo.utils import counters

    from lit.models.gpt import GPT
    from lit.models.transformer import TransformerConfig
    from lit.parallel import compile_model
    from lit.readout_loss import chunk_tokens, readout_loss

    torch.manual_seed(0)
    model = GPT(VOCAB, block, TransformerConfig(d_model=d_model, n_layers=layers, n_heads=4, mlp="swiglu",
                                                norm="rmsnorm", residual="add", projection="linear"))
    compile_model(model)
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, VOCAB, (batch, block), generator=g)
    targets = torch.randint(0, VOCAB, (batch, block), generator=g)

    def train_step() -> float:
        t = time.perf_counter()
        model.train()
        loss, _ = readout_loss(model.readout, model(idx, readout=False), targets, chunk_tokens(VOCAB, 256.0))
        loss.backward()
        model.zero_grad(set_to_none=True)
        return time.perf_counter() - t

    def eval_forward() -> float:
        t = time.perf_counter()
        model.eval()
        with torch.no_grad():
            model(idx)
        return time.perf_counter() - t

    first = train_step() + eval_forward()
    steady = min(train_step() + eval_forward() for _ in range(3))
    result = {"compile_s": first - steady, "steady_s": steady, "process_s": time.perf_counter() - started,
              "cache_dir": compile_cache.environment(sweep_folder)[compile_cache.CACHE_DIR_ENV],
              "fxgraph_hit": counters["inductor"]["fxgraph_cache_hit"],
              "fxgraph_miss": counters["inductor"]["fxgraph_cache_miss"],
              "autograd_hit": counters["aot_autograd"]["autograd_cache_hit"],
              "autograd_miss": counters["aot_autograd"]["autograd_cache_miss"]}
    out.write_text(json.dumps(result))


def run_child(sweep_folder: Path, args: argparse.Namespace) -> dict:
    out = sweep_folder / f"child{len(list(sweep_folder.glob('child*.json')))}.json"
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    env.setdefault("OMP_NUM_THREADS", "1")
    subprocess.run([sys.executable, "-m", "benchmarks.compile_cache", "--child", str(sweep_folder), "--out", str(out),
                    "--layers", str(args.layers), "--d_model", str(args.d_model), "--batch", str(args.batch),
                    "--block", str(args.block)], cwd=REPO, env=env, check=True)
    return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compile_cache", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--d_model", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--block", type=int, default=64)
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        child(args.child, args.out, args.layers, args.d_model, args.batch, args.block)
        return 0
    import torch

    print(f"torch {torch.__version__}, {args.layers} layers, d {args.d_model}, {args.batch} x {args.block} tokens, "
          f"OMP_NUM_THREADS=1 per child")
    print("| round | cold compile s | warm compile s | cold / warm | cold process s | warm process s | "
          "warm hits (FX graph, AOTAutograd) | cold misses (FX graph, AOTAutograd) |")
    print("|---|---|---|---|---|---|---|---|")
    ratios = []
    for round_ in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="sweep-") as folder:
            cold, warm = run_child(Path(folder), args), run_child(Path(folder), args)
        assert cold["cache_dir"] == warm["cache_dir"]
        ratios.append(cold["compile_s"] / warm["compile_s"])
        print(f"| {round_} | {cold['compile_s']:.1f} | {warm['compile_s']:.2f} | {ratios[-1]:.1f}x | "
              f"{cold['process_s']:.1f} | {warm['process_s']:.1f} | {warm['fxgraph_hit']}, {warm['autograd_hit']} | "
              f"{cold['fxgraph_miss']}, {cold['autograd_miss']} |", flush=True)
    print(f"cold / warm compile: median {statistics.median(ratios):.1f}x, range {min(ratios):.1f}-{max(ratios):.1f}x "
          f"over {len(ratios)} rounds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
