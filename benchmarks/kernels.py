"""The Triton kernels (arch_plugins.kernels) on a GPU: per-op time and bandwidth, whole training steps, the goals.

What it measures, bf16 autocast, fp32 parameters and stream (Lightning's bf16-mixed):

1. Each fused op at a realistic size (default 8 x 1024 tokens, d_model 1024, 16 heads, Pattention FFN n = 4d),
   forward and forward+backward, for the eager torch path, ``torch.compile`` of that path, and the Triton kernel:
   the median time over repetitions (20th-80th percentile for the noise), each after an L2 flush, and the
   kernel's achieved bandwidth (the bytes it must move: every input read once, every output written once)
   against the GPU's peak (spec sheet where known, and a measured device-to-device copy).
2. Whole training steps (forward, cross-entropy, backward, AdamW, zero_grad; nGPT also the unit-norm
   renormalisation its callback runs) of recipes/gpt_ngpt.yaml, recipes/gpt_tokenformer.yaml and
   recipes/gpt_baseline.yaml scaled to d_model 1024: eager, torch.compile, the kernels, and the kernels under
   torch.compile (the kernels are custom ops, opaque to it, with no graph break), in interleaved rounds.
3. The goals: nGPT step / GPT step <= 1.05 with the kernels (the paper's unfused code: 1.6-1.8);
   a Pattention FFN / a dense GELU MLP of equal FLOPs (tokens = hidden width) <= 1.02; every kernel >= 70% of
   peak bandwidth.

It writes benchmarks/results/kernels_<gpu>.json and prints the ``MEASURED_SPEEDUPS`` entry for
arch_plugins/kernels/measured.py: per op, (faster of eager and compile) / kernel, forward+backward.

    python -m benchmarks.kernels                       # on a CUDA GPU: everything above (a few minutes)
    python -m benchmarks.kernels --layers 24           # the paper's 0.5B depth
    python -m benchmarks.kernels --dry                 # anywhere: tiny shapes, every path once, no figures
                                                       # (on CPU: in Triton's interpreter, a few minutes,
                                                       # mostly torch.compile; --no_compile: about one)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

RESULTS = Path(__file__).resolve().parent / "results"

# Spec-sheet peak memory bandwidth (bytes/s), matched against torch.cuda.get_device_name().
PEAK_BANDWIDTH = {
    "H200": 4.8e12,
    "H100 80GB HBM3": 3.35e12,  # SXM
    "H100 NVL": 3.9e12,
    "H100 PCIe": 2.0e12,
    "A100-SXM4-80GB": 2.039e12,
    "A100 80GB PCIe": 1.935e12,
    "A100-SXM4-40GB": 1.555e12,
    "A100-PCIE-40GB": 1.555e12,
    "L40S": 0.864e12,
    "RTX 4090": 1.008e12,
}

GOALS = {"ngpt_vs_gpt_step": 1.05, "pattention_vs_mlp_step": 1.02, "bandwidth_fraction": 0.70}


# --- timing ------------------------------------------------------------------------------------------------

class Timer:
    """Per-call times of ``fn``: CUDA events after an L2 flush on a GPU, perf_counter on CPU (--dry only)."""

    def __init__(self, device: torch.device, reps: int, warmup: int):
        self.device, self.reps, self.warmup = device, reps, warmup
        self.flush = torch.empty(256 << 20, dtype=torch.int8, device=device) if device.type == "cuda" else None

    def __call__(self, fn: Callable[[], object]) -> dict[str, float]:
        for _ in range(self.warmup):
            fn()
        times = []
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                      for _ in range(self.reps)]
            for start, end in events:
                self.flush.zero_()  # a cold L2: the tensors come from memory, as in a training step
                start.record()
                fn()
                end.record()
            torch.cuda.synchronize()
            times = [start.elapsed_time(end) / 1e3 for start, end in events]
        else:
            for _ in range(self.reps):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        q = statistics.quantiles(times, n=5, method="inclusive") if len(times) >= 2 else times * 4
        return {"median_s": statistics.median(times), "p20_s": q[0], "p80_s": q[-1]}


def peak_bandwidth(device: torch.device, timer: Timer) -> dict[str, float | None]:
    """The spec sheet's peak (if the GPU is in the table) and a measured copy's bandwidth."""
    if device.type != "cuda":
        return {"spec_bytes_per_s": None, "copy_bytes_per_s": None}
    name = torch.cuda.get_device_name(device)
    spec = next((bw for key, bw in PEAK_BANDWIDTH.items() if key in name), None)
    src = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    t = timer(lambda: dst.copy_(src))["median_s"]
    return {"spec_bytes_per_s": spec, "copy_bytes_per_s": 2 * src.numel() / t}


# --- the ops ------------------------------------------------------------------------------------------------

def op_cases(args, device: torch.device) -> list[dict]:
    """Each op with its eager path, its kernel, inputs as a bf16 training step has them, and its bytes."""
    from arch_plugins.kernels.ngpt_stream_update import ngpt_stream_update
    from arch_plugins.kernels.pattention_theta import pattention_theta
    from arch_plugins.kernels.qk_normalize import qk_normalize
    from arch_plugins.kernels.row_l2_normalize import row_l2_normalize
    from arch_plugins.norms.hypersphere import l2_normalize
    from arch_plugins.projections.pattention import theta

    g = torch.Generator(device=device).manual_seed(0)
    N, d, H = args.batch * args.seq, args.d_model, args.heads
    dk, n_ffn = d // H, 4 * d

    def randn(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, generator=g, device=device).to(dtype).requires_grad_()

    # A sublayer's output (bf16 under autocast) -> the fp32 stream; q/k after RoPE (bf16, (B, H, T, dk)).
    branch, stream = randn(N, d), l2_normalize(randn(N, d, dtype=torch.float32)).detach().requires_grad_()
    alpha = (torch.rand(d, generator=g, device=device) * 0.1).requires_grad_()
    q, k = randn(args.batch, H, args.seq, dk), randn(args.batch, H, args.seq, dk)
    s2 = (torch.rand(H, dk, generator=g, device=device) + 0.5).requires_grad_()
    scores = randn(N, n_ffn)
    scale = torch.tensor(float(n_ffn), device=device).sqrt()
    b16, b32 = 2, 4
    return [
        # bytes: (forward, backward); every tensor read or written once, at its dtype.
        {"op": "row_l2_normalize", "inputs": [branch], "eager": lambda x: l2_normalize(x, 1e-12),
         "kernel": lambda x: row_l2_normalize(x, 1e-12),
         "bytes": (N * d * (b16 + b32), N * d * (b16 + b32 + b16))},
        {"op": "qk_normalize", "inputs": [q, k, s2],
         "eager": lambda q, k, s2: (l2_normalize(q, 1e-12) * s2.view(H, 1, dk), l2_normalize(k, 1e-12)),
         "kernel": lambda q, k, s2: qk_normalize(q, k, s2, 1e-12),
         "bytes": (2 * N * d * (b16 + b32), 2 * N * d * (b16 + b32 + b16))},
        {"op": "ngpt_stream_update", "inputs": [stream, branch, alpha],
         # The new stream only gets a gradient (the normalised branch feeds the diagnostics, under no_grad).
         "eager": lambda h, b, a: _eager_stream_update(l2_normalize, h, b, a)[0],
         "kernel": lambda h, b, a: ngpt_stream_update(h, b, a, 1e-12, 1e-12)[0],
         # forward: read h, b; write out, bn. backward: read h, b, g; write dh, db.
         "bytes": (N * d * (b32 + b16 + b32 + b32), N * d * (b32 + b16 + b32 + b32 + b16))},
        {"op": "pattention_theta", "inputs": [scores], "eager": lambda a: theta(a, "l2_norm_gelu", scale, 1e-5),
         "kernel": lambda a: pattention_theta(a, scale, 1e-5),
         "bytes": (N * n_ffn * 2 * b16, N * n_ffn * 3 * b16)},
    ]


def _eager_stream_update(l2_normalize, h, b, a):
    bn = l2_normalize(b, 1e-12)
    return l2_normalize(torch.lerp(h, bn.to(h.dtype), a.to(h.dtype)), 1e-12), bn


def _forward_backward(fn, inputs):
    grads_out = None

    def run():
        nonlocal grads_out
        outs = fn(*inputs)
        outs = outs if isinstance(outs, tuple) else (outs,)
        if grads_out is None:
            grads_out = [torch.ones_like(o) for o in outs]
        torch.autograd.grad(outs, inputs, grads_out)

    return run


def measure_ops(args, device, timer, peak) -> list[dict]:
    rows = []
    best_peak = peak["spec_bytes_per_s"] or peak["copy_bytes_per_s"]
    for case in op_cases(args, device):
        paths = {"eager": case["eager"], "kernel": case["kernel"]}
        if not args.no_compile:
            paths["compile"] = torch.compile(case["eager"], dynamic=False)
        row = {"op": case["op"], "bytes_forward": case["bytes"][0], "bytes_backward": case["bytes"][1]}
        inputs = case["inputs"]
        for path, fn in paths.items():
            with torch.no_grad():
                fwd = timer(lambda fn=fn, inputs=inputs: fn(*inputs))
            both = timer(_forward_backward(fn, inputs))
            row[path] = {"forward": fwd, "forward_backward": both}
        kernel = row["kernel"]
        fwd_s = kernel["forward"]["median_s"]
        bwd_s = max(kernel["forward_backward"]["median_s"] - fwd_s, 1e-12)  # backward ~ the difference
        row["kernel_forward_bytes_per_s"] = case["bytes"][0] / fwd_s
        row["kernel_backward_bytes_per_s"] = case["bytes"][1] / bwd_s
        if best_peak:
            row["kernel_forward_fraction_of_peak"] = row["kernel_forward_bytes_per_s"] / best_peak
            row["kernel_backward_fraction_of_peak"] = row["kernel_backward_bytes_per_s"] / best_peak
        torch_best = min(row[p]["forward_backward"]["median_s"] for p in paths if p != "kernel")
        row["speedup_vs_best_torch"] = torch_best / kernel["forward_backward"]["median_s"]
        rows.append(row)
        print(f"  {case['op']}: done", flush=True)
    return rows


# --- whole steps --------------------------------------------------------------------------------------------

def recipe_arch(name: str, args, **override) -> dict:
    """A recipe's architecture, scaled to the benchmark's size (recipes are sized for 2 CPU cores)."""
    import yaml

    recipe = yaml.safe_load((Path(__file__).resolve().parents[1] / "recipes" / f"{name}.yaml").read_text())
    arch = dict(recipe["model"]["init_args"]["arch"])
    arch.update(d_model=args.d_model, n_layers=args.layers, n_heads=args.heads)
    if "init_std" in arch and arch.get("norm") == "hypersphere":
        arch["init_std"] = args.d_model ** -0.5  # the recipe's 1/sqrt(d_model), at this width
    arch.pop("projection_options", None)  # TokenFormer's token counts: its rule (n = d, 4d) at this width
    arch.update(override)
    return arch


def with_kernel(arch: dict, kernel: str) -> dict:
    """The same architecture with every plugin that has a kernel option set to ``kernel``."""
    arch = dict(arch)
    if arch.get("norm") == "hypersphere":
        arch["norm_options"] = {**arch.get("norm_options", {}), "kernel": kernel}
    if arch.get("residual") == "ngpt":
        arch["residual_options"] = {**arch.get("residual_options", {}), "kernel": kernel}
    if arch.get("projection", "").startswith("pattention"):
        arch["projection_options"] = {**arch.get("projection_options", {}), "kernel": kernel}
    return arch


def training_step(arch: dict, args, device, compiled: bool) -> Callable[[], None]:
    from arch_plugins.constraints import renormalize_, unit_norm_parameters
    from lit.models import GPT, TransformerConfig

    torch.manual_seed(0)
    model = GPT(args.vocab, args.seq, TransformerConfig(**arch)).to(device)
    renorm = any(True for _ in unit_norm_parameters(model))
    if renorm:
        renormalize_(model)
    forward = torch.compile(model) if compiled else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0, fused=device.type == "cuda")
    g = torch.Generator(device=device).manual_seed(0)
    idx = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=g, device=device)
    dtype = torch.bfloat16

    def step() -> None:
        with torch.autocast(device.type, dtype=dtype):
            logits = forward(idx[:, :-1])
        F.cross_entropy(logits.float().flatten(0, 1), idx[:, 1:].flatten()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if renorm:
            renormalize_(model)  # what the RenormalizeUnitNormWeights callback runs after each step

    return step


def measure_steps(args, device, timer) -> dict[str, dict]:
    from arch_plugins import registry
    from benchmarks.pattention_vs_mlp import PattentionFFNOnly

    registry.register("projection", "pattention_ffn_only", PattentionFFNOnly, package="benchmarks")
    models = {
        "gpt": recipe_arch("gpt_baseline", args),
        "ngpt": recipe_arch("gpt_ngpt", args),
        "tokenformer": recipe_arch("gpt_tokenformer", args),
        # Pattention FFN vs a dense MLP of equal FLOPs: the same pre-LN GPT, only the FFN differs (d -> 4d -> d).
        "mlp_ffn": dict(d_model=args.d_model, n_layers=args.layers, n_heads=args.heads, norm="layernorm",
                        mlp="gelu", mlp_hidden=4 * args.d_model),
        "pattention_ffn": dict(d_model=args.d_model, n_layers=args.layers, n_heads=args.heads, norm="layernorm",
                               projection="pattention_ffn_only", projection_options={"tokens_ffn": 4 * args.d_model}),
    }
    modes = [("eager", "torch", False), ("kernels", "triton", False)]
    if not args.no_compile:
        modes += [("compile", "torch", True), ("kernels+compile", "triton", True)]
    contenders = {}
    for model, arch in models.items():
        has_kernel = with_kernel(arch, "triton") != arch
        for mode, kernel, compiled in modes:
            if kernel == "triton" and not has_kernel:
                continue  # gpt and the dense MLP have no kernel: their eager/compile steps are the reference
            step = contenders[f"{model}/{mode}"] = training_step(with_kernel(arch, kernel), args, device, compiled)
            for _ in range(2):  # compile (and recompile once optimizer state exists) now, not in a timed round
                step()
    results: dict[str, list[float]] = {name: [] for name in contenders}
    names = list(contenders)
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]  # rotate, so drift hits every contender alike
        for name in order:
            results[name].append(timer(contenders[name])["median_s"])
        print(f"  round {r + 1}/{args.rounds} done", flush=True)
    return {name: {"median_s": statistics.median(t), "min_s": min(t), "max_s": max(t), "rounds": t}
            for name, t in results.items()}


def ratios(steps: dict[str, dict]) -> dict[str, float]:
    """nGPT / GPT and Pattention FFN / dense MLP, per mode, each against the reference's own mode."""
    out = {}
    for mode in ("eager", "compile", "kernels", "kernels+compile"):
        ref_mode = "compile" if "compile" in mode else "eager"
        for num, den, key in (("ngpt", "gpt", "ngpt_vs_gpt_step"), ("pattention_ffn", "mlp_ffn",
                                                                     "pattention_vs_mlp_step"),
                              ("tokenformer", "gpt", "tokenformer_vs_gpt_step")):
            if f"{num}/{mode}" in steps and f"{den}/{ref_mode}" in steps:
                out[f"{key} ({mode})"] = steps[f"{num}/{mode}"]["median_s"] / steps[f"{den}/{ref_mode}"]["median_s"]
    return out


# --- report -------------------------------------------------------------------------------------------------

def report(result: dict) -> None:
    ms = lambda t: f"{t['median_s'] * 1e3:.3f} [{t['p20_s'] * 1e3:.3f}-{t['p80_s'] * 1e3:.3f}]"
    print("\n## Per op (ms, median [20th-80th percentile]); bandwidth of the kernel\n")
    paths = [p for p in ("eager", "compile", "kernel") if p in result["ops"][0]]
    print("| op | " + " | ".join(f"{p} fwd | {p} fwd+bwd" for p in paths)
          + " | kernel fwd GB/s | kernel bwd GB/s | fraction of peak (fwd, bwd) | speedup |")
    print("|---|" + "---:|" * (2 * len(paths) + 4))
    for row in result["ops"]:
        cells = [f"{ms(row[p]['forward'])} | {ms(row[p]['forward_backward'])}" for p in paths]
        frac = (f"{row['kernel_forward_fraction_of_peak']:.0%}, {row['kernel_backward_fraction_of_peak']:.0%}"
                if "kernel_forward_fraction_of_peak" in row else "n/a")
        print(f"| {row['op']} | " + " | ".join(cells) + f" | {row['kernel_forward_bytes_per_s'] / 1e9:,.0f} | "
              f"{row['kernel_backward_bytes_per_s'] / 1e9:,.0f} | {frac} | {row['speedup_vs_best_torch']:.2f} |")
    print("\n## Training steps (ms, median over rounds [min-max])\n\n| model/mode | step |\n|---|---:|")
    for name, t in result["steps"].items():
        print(f"| {name} | {t['median_s'] * 1e3:.1f} [{t['min_s'] * 1e3:.1f}-{t['max_s'] * 1e3:.1f}] |")
    print("\n## Ratios (goals: nGPT/GPT <= 1.05 with the kernels; Pattention FFN/MLP <= 1.02)\n")
    for key, value in result["ratios"].items():
        print(f"- {key}: {value:.3f}")
    if result["dry"]:
        print("\nDry run: tiny shapes (and on CPU Triton's interpreter), so none of these figures means anything.")
        return
    entry = {row["op"]: round(row["speedup_vs_best_torch"], 2) for row in result["ops"]}
    print(f"\nFor arch_plugins/kernels/measured.py (measured {result['date']}, {result['device']}):\n"
          f"    {result['device']!r}: {entry},")


def main(argv: list[str] | None = None) -> dict | None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in [("d_model", 1024), ("heads", 16), ("layers", 12), ("seq", 1024), ("batch", 8),
                          ("vocab", 32000), ("reps", 50), ("warmup", 5), ("rounds", 5)]:
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--no_compile", action="store_true", help="skip the torch.compile paths")
    p.add_argument("--dry", action="store_true", help="tiny shapes, every path once: checks that it runs")
    p.add_argument("--out", type=Path, default=None, help="where the JSON goes (default: benchmarks/results/)")
    args = p.parse_args(argv)
    from arch_plugins.kernels import dispatch

    if dispatch.triton_import_error() is not None:
        print(f"error: triton does not import here ({dispatch.triton_import_error()})", file=sys.stderr)
        raise SystemExit(2)
    cuda = torch.cuda.is_available()
    if not cuda and not args.dry:
        print("error: benchmarks/kernels.py measures Triton kernels on a CUDA GPU, and there is none here; "
              "run it on a GPU, or with --dry to check that it runs (tiny shapes, Triton's interpreter)",
              file=sys.stderr)
        raise SystemExit(2)
    if not cuda and not dispatch.interpreting():
        # The interpreter must be on before triton is first imported (lightning imports it): start over.
        os.execve(sys.executable, [sys.executable, "-m", "benchmarks.kernels", *(argv or sys.argv[1:])],
                  {**os.environ, "TRITON_INTERPRET": "1"})
    if args.dry:
        args.d_model, args.heads, args.layers, args.seq, args.batch, args.vocab = 32, 2, 1, 8, 2, 64
        args.reps, args.warmup, args.rounds = 2, 1, 2
    device = torch.device("cuda" if cuda else "cpu")
    timer = Timer(device, args.reps, args.warmup)
    name = torch.cuda.get_device_name(device) if cuda else "cpu (Triton interpreter)"
    print(f"{name}: torch {torch.__version__}, d_model {args.d_model}, {args.layers} layers, {args.heads} heads, "
          f"{args.batch} x {args.seq} tokens, bf16 autocast{' (dry run: no figures)' if args.dry else ''}", flush=True)
    peak = peak_bandwidth(device, timer)
    print("per-op timings", flush=True)
    ops = measure_ops(args, device, timer, peak)
    step_timer = Timer(device, 1 if args.dry else 3, 0)
    print("training steps", flush=True)
    steps = measure_steps(args, device, step_timer)
    result = {"device": name, "dry": args.dry, "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
              "python": platform.python_version(), "args": vars(args) | {"out": None}, "peak": peak, "ops": ops,
              "steps": steps, "ratios": ratios(steps), "goals": GOALS}
    report(result)
    if not args.dry:
        out = args.out or RESULTS / f"kernels_{name.replace(' ', '_').replace('/', '_')}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1))
        print(f"\nwrote {out}")
    return result


if __name__ == "__main__":
    main()
