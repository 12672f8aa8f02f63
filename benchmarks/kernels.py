"""The Triton kernels (arch_plugins.kernels) on a GPU: device time per op, whole compiled steps, a verdict per kernel.

What it measures, bf16 autocast, fp32 parameters and stream (Lightning's bf16-mixed):

1. Each fused op at a realistic size (default 8 x 1024 tokens, d_model 1024, 16 heads, Pattention FFN n = 4d,
   mHC's n = 4 streams with 20 Sinkhorn iterations, AttnRes over 13 sources), forward and forward+backward, for
   the eager torch path, ``torch.compile`` of that path, and the Triton kernel, on **device time**: a CUDA graph of
   the calls captured and replayed (``triton.testing.do_bench_cudagraph``), so that no host work (Python
   dispatch, the custom op's autograd bridge, launches) is counted; where a path cannot be captured, the
   profiler's kernel durations are summed instead. An earlier version timed each call between CUDA events after an
   L2 flush, which let host work into the forward+backward figure: its "backward at 2-9% of bandwidth" was host
   time (shared/specs/gpu-plugins.md section 3). Also each kernel's achieved bandwidth (the bytes it must move)
   against the GPU's peak.
2. Whole training steps (forward, cross-entropy, backward, AdamW, zero_grad; nGPT also its unit-norm
   renormalisation) of each model that has a kernel (recipes/gpt_ngpt.yaml, gpt_tokenformer.yaml, mHC and full
   AttnRes on gpt_baseline.yaml) scaled to d_model 1024: ``torch.compile`` against the kernels under
   ``torch.compile`` (custom ops, opaque to Inductor), in interleaved rounds. ``--goals`` adds the eager modes
   and issue 16's goals (nGPT step / GPT step <= 1.05 with the kernels; a Pattention FFN / a dense GELU MLP of
   equal FLOPs <= 1.02).
3. A verdict per kernel: ``keep`` when its forward+backward device time is at least 1.05x faster than compiled
   torch and the compiled step with it is no slower than the compiled step without; else ``remove``.

It writes benchmarks/results/kernels_<gpu>.json and prints the ``MEASURED_SPEEDUPS`` entry for
arch_plugins/kernels/measured.py: per op, (faster of eager and compile) / kernel, forward+backward device time.

    python -m benchmarks.kernels                       # on a CUDA GPU: the verdict run, ~90 s (not yet timed)
    python -m benchmarks.kernels --goals --layers 12   # also eager steps and the goals' models
    python -m benchmarks.kernels --dry                 # anywhere: tiny shapes, every path once, no figures
                                                       # (on CPU: in Triton's interpreter, a few minutes,
                                                       # mostly torch.compile; --no_compile: about one)
    python -m benchmarks.kernels --dry --no_compile --ops depth_softmax --models attnres   # seconds
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

from lit.errors import OneLineArgumentParser, UserInputError, one_line_errors

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


class DeviceClock:
    """Device time per call of ``fn``: the GPU's time only, none of the host's.

    On a GPU, ``triton.testing.do_bench_cudagraph``: the calls are captured into one CUDA graph and replayed, so
    the figure is the kernels' durations and the gaps between them on the device, with no Python dispatch or
    launch cost (what a step pays under CUDA graphs, and the floor of what it pays otherwise). The replays run back
    to back, without an L2 flush (50 MB of L2 on an H100/H200): a call that touches more reads mostly from memory,
    a smaller one partly from L2, on every path alike. Where capture fails (a path that syncs or allocates on the
    host), the profiler's kernel durations are summed instead, over ``reps`` calls each after an L2 flush, less the
    flushes' own time measured alone; ``method`` says which. On CPU (``--dry``) it is host time, and means nothing.
    """

    def __init__(self, device: torch.device, reps: int, rep_ms: int = 40):
        self.device, self.reps, self.rep_ms = device, reps, rep_ms
        self.flush = torch.empty(256 << 20, dtype=torch.int8, device=device) if device.type == "cuda" else None

    def __call__(self, fn: Callable[[], object]) -> dict[str, float | str]:
        if self.device.type != "cuda":
            return {**Timer(self.device, self.reps, 1)(fn), "method": "host time (dry run)"}
        try:
            import triton.testing

            times = [t / 1e3 for t in triton.testing.do_bench_cudagraph(fn, rep=self.rep_ms, return_mode="all")]
        except Exception as exc:  # capture refused: fall back on the profiler's kernel durations
            torch.cuda.synchronize()
            return {**self.profiled(fn), "capture_error": f"{type(exc).__name__}: {exc}".splitlines()[0][:200]}
        q = statistics.quantiles(times, n=5, method="inclusive")
        return {"median_s": statistics.median(times), "p20_s": q[0], "p80_s": q[-1], "method": "cuda graph replay"}

    def profiled(self, fn: Callable[[], object]) -> dict[str, float | str]:
        from torch.profiler import ProfilerActivity, profile

        for _ in range(3):
            fn()
        totals = []
        for call in (self.flush.zero_, lambda: (self.flush.zero_(), fn())):
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(self.reps):
                    call()
                torch.cuda.synchronize()
            # The GPU's own events (kernels, memsets), each its duration in microseconds.
            totals.append(sum(e.device_time_total for e in prof.events()
                              if e.device_type == torch.autograd.DeviceType.CUDA) / 1e6)
        per_call = max(totals[1] - totals[0], 0.0) / self.reps
        return {"median_s": per_call, "p20_s": per_call, "p80_s": per_call,
                "method": "profiler kernel sum (one figure: no spread)"}


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
    from arch_plugins.kernels.depth_softmax import depth_softmax
    from arch_plugins.kernels.ngpt_stream_update import ngpt_stream_update
    from arch_plugins.kernels.pattention_theta import pattention_theta
    from arch_plugins.kernels.qk_normalize import qk_normalize
    from arch_plugins.kernels.row_l2_normalize import row_l2_normalize
    from arch_plugins.kernels.sinkhorn_knopp import sinkhorn_knopp as fused_sinkhorn_knopp
    from arch_plugins.norms.hypersphere import l2_normalize
    from arch_plugins.projections.pattention import theta
    from arch_plugins.residuals.attnres import DepthSoftmax
    from arch_plugins.residuals.manifold_hyper_connections import sinkhorn_knopp

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
    # mHC: the H_res logits, a (tokens, n, n) slice of the fp32 coefficient row (n^2 + 2n per token), 20 iterations.
    n, iters = 4, args.sinkhorn_iters
    res_logits = (torch.randn(N, n * n + 2 * n, generator=g, device=device) * 2)[:, 2 * n:].unflatten(-1, (n, n))
    res_logits.requires_grad_()
    # AttnRes: a consumer's sources, the fp32 embedding and bf16 sublayer outputs; the pseudo-query in fp32.
    m = args.depth_sources
    sources = [randn(N, d, dtype=torch.float32)] + [randn(N, d) for _ in range(m - 1)]
    query = (torch.randn(d, generator=g, device=device) * 0.1).requires_grad_()
    b16, b32 = 2, 4
    depth_bytes = (b32 + (m - 1) * b16) * N * d  # every source once
    cases = [
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
        {"op": "sinkhorn_knopp", "inputs": [res_logits], "eager": lambda x: sinkhorn_knopp(x, iters),
         "kernel": lambda x: fused_sinkhorn_knopp(x, iters),
         # forward: read the logits, write H_res; backward: read the logits and g, write the logits' gradient.
         "bytes": (N * n * n * 2 * b32, N * n * n * 3 * b32)},
        {"op": "depth_softmax", "inputs": [query, *sources],
         "eager": lambda q, *s: DepthSoftmax.apply(q, 1e-6, *s), "kernel": lambda q, *s: depth_softmax(q, s, 1e-6),
         # forward: read every source, write the fp32 output; backward: read every source twice and g, write every
         # source's gradient.
         "bytes": (depth_bytes + N * d * b32, 3 * depth_bytes + N * d * b32)},
    ]
    return [case for case in cases if case["op"] in args.ops]


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


def measure_ops(args, device, clock, peak) -> list[dict]:
    """Each op's forward and forward+backward per path, on ``clock`` (a DeviceClock: device time on a GPU)."""
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
                fwd = clock(lambda fn=fn, inputs=inputs: fn(*inputs))
            both = clock(_forward_backward(fn, inputs))
            row[path] = {"forward": fwd, "forward_backward": both}
        kernel = row["kernel"]
        fwd_s = kernel["forward"]["median_s"]
        # Both figures device time: their difference is the backward's, which host work no longer inflates.
        bwd_s = max(kernel["forward_backward"]["median_s"] - fwd_s, 1e-12)
        row["kernel_forward_bytes_per_s"] = case["bytes"][0] / fwd_s
        row["kernel_backward_bytes_per_s"] = case["bytes"][1] / bwd_s
        if best_peak:
            row["kernel_forward_fraction_of_peak"] = row["kernel_forward_bytes_per_s"] / best_peak
            row["kernel_backward_fraction_of_peak"] = row["kernel_backward_bytes_per_s"] / best_peak
        kernel_s = kernel["forward_backward"]["median_s"]
        torch_best = min(row[p]["forward_backward"]["median_s"] for p in paths if p != "kernel")
        row["speedup_vs_best_torch"] = torch_best / kernel_s
        if "compile" in row:
            row["speedup_vs_compile"] = row["compile"]["forward_backward"]["median_s"] / kernel_s
        row["clock"] = sorted({row[p][k].get("method", "CUDA events around each call") for p in paths
                               for k in ("forward", "forward_backward")})
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
    if arch.get("residual") in ("ngpt", "mhc", "attnres", "attnres_block"):
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


# The models with a kernel, and the ops each one runs (the verdict reads each op's step from them).
MODEL_OPS = {"ngpt": ("row_l2_normalize", "qk_normalize", "ngpt_stream_update"), "tokenformer": ("pattention_theta",),
             "mhc": ("sinkhorn_knopp",), "attnres": ("depth_softmax",)}
# Without a kernel: the references of issue 16's goals (--goals).
GOAL_MODELS = ("gpt", "mlp_ffn", "pattention_ffn")


def step_models(args) -> dict[str, dict]:
    from arch_plugins import registry
    from benchmarks.pattention_vs_mlp import PattentionFFNOnly

    if "pattention_ffn_only" not in registry.names("projection"):
        registry.register("projection", "pattention_ffn_only", PattentionFFNOnly, package="benchmarks")
    models = {
        "gpt": recipe_arch("gpt_baseline", args),
        "ngpt": recipe_arch("gpt_ngpt", args),
        "tokenformer": recipe_arch("gpt_tokenformer", args),
        "mhc": recipe_arch("gpt_baseline", args, residual="mhc"),
        "attnres": recipe_arch("gpt_baseline", args, residual="attnres"),
        # Pattention FFN vs a dense MLP of equal FLOPs: the same pre-LN GPT, only the FFN differs (d -> 4d -> d).
        "mlp_ffn": dict(d_model=args.d_model, n_layers=args.layers, n_heads=args.heads, norm="layernorm",
                        mlp="gelu", mlp_hidden=4 * args.d_model),
        "pattention_ffn": dict(d_model=args.d_model, n_layers=args.layers, n_heads=args.heads, norm="layernorm",
                               projection="pattention_ffn_only", projection_options={"tokens_ffn": 4 * args.d_model}),
    }
    wanted = [m for m in args.models if m in MODEL_OPS] + (list(GOAL_MODELS) if args.goals else [])
    return {name: models[name] for name in wanted}


def measure_steps(args, device, timer, deadline: float = float("inf")) -> dict[str, dict]:
    """Whole steps per model and mode, interleaved; a model whose compiles would start after ``deadline``
    (perf_counter) is left out and named, so that the run keeps its time budget."""
    modes = [("compile", "torch", True), ("kernels+compile", "triton", True)]
    if args.goals or args.no_compile:
        modes = [("eager", "torch", False), ("kernels", "triton", False)] + ([] if args.no_compile else modes)
    contenders, skipped = {}, []
    for model, arch in step_models(args).items():
        has_kernel = with_kernel(arch, "triton") != arch
        over_budget = time.perf_counter() > deadline  # a model's modes all or none: a ratio needs both
        for mode, kernel, compiled in modes:
            if kernel == "triton" and not has_kernel:
                continue  # gpt and the dense MLP have no kernel: their eager/compile steps are the reference
            if over_budget:
                skipped.append(f"{model}/{mode}")
                continue
            step = contenders[f"{model}/{mode}"] = training_step(with_kernel(arch, kernel), args, device, compiled)
            for _ in range(2):  # compile (and recompile once optimizer state exists) now, not in a timed round
                step()
    results: dict[str, list[float]] = {name: [] for name in contenders}
    names = list(contenders)
    for r in range(args.rounds if names else 0):
        order = names[r % len(names):] + names[:r % len(names)]  # rotate, so drift hits every contender alike
        for name in order:
            results[name].append(timer(contenders[name])["median_s"])
        print(f"  round {r + 1}/{args.rounds} done", flush=True)
    steps = {name: {"median_s": statistics.median(t), "min_s": min(t), "max_s": max(t), "rounds": t}
             for name, t in results.items()}
    steps.update({name: {"skipped": "over the time budget (--budget_s)"} for name in skipped})
    return steps


def verdicts(ops: list[dict], steps: dict[str, dict], min_speedup: float) -> dict[str, dict]:
    """Per kernel: keep when its forward+backward device time beats compiled torch by ``min_speedup`` and the
    compiled step with it (kernels+compile) is no slower than the compiled step without; else remove. A kernel
    without a compiled measurement gets no verdict ("not measured")."""
    out = {}
    for row in ops:
        op_speedup = row.get("speedup_vs_compile")
        model = next((m for m, model_ops in MODEL_OPS.items() if row["op"] in model_ops), None)
        with_kernels, without = steps.get(f"{model}/kernels+compile", {}), steps.get(f"{model}/compile", {})
        step_speedup = (without["median_s"] / with_kernels["median_s"]
                        if "median_s" in with_kernels and "median_s" in without else None)
        if op_speedup is None:
            verdict = "not measured"
        elif op_speedup >= min_speedup and (step_speedup is None or step_speedup >= 1.0):
            verdict = "keep"
        else:
            verdict = "remove"
        out[row["op"]] = {"op_speedup_vs_compile": op_speedup, "step_model": model,
                          "step_speedup_vs_compile": step_speedup, "verdict": verdict}
    return out


def ratios(steps: dict[str, dict]) -> dict[str, float]:
    """nGPT / GPT and Pattention FFN / dense MLP, per mode, each against the reference's own mode."""
    out = {}
    for mode in ("eager", "compile", "kernels", "kernels+compile"):
        ref_mode = "compile" if "compile" in mode else "eager"
        for num, den, key in (("ngpt", "gpt", "ngpt_vs_gpt_step"), ("pattention_ffn", "mlp_ffn",
                                                                     "pattention_vs_mlp_step"),
                              ("tokenformer", "gpt", "tokenformer_vs_gpt_step")):
            if "median_s" in steps.get(f"{num}/{mode}", {}) and "median_s" in steps.get(f"{den}/{ref_mode}", {}):
                out[f"{key} ({mode})"] = steps[f"{num}/{mode}"]["median_s"] / steps[f"{den}/{ref_mode}"]["median_s"]
    return out


# --- report -------------------------------------------------------------------------------------------------

def report(result: dict) -> None:
    ms = lambda t: f"{t['median_s'] * 1e3:.3f} [{t['p20_s'] * 1e3:.3f}-{t['p80_s'] * 1e3:.3f}]"
    print("\n## Per op: device time (ms, median [20th-80th percentile]); bandwidth of the kernel\n")
    clocks = sorted({c for row in result["ops"] for c in row["clock"]})
    print(f"Clock: {', '.join(clocks)}.\n")
    paths = [p for p in ("eager", "compile", "kernel") if p in result["ops"][0]]
    print("| op | " + " | ".join(f"{p} fwd | {p} fwd+bwd" for p in paths)
          + " | kernel fwd GB/s | kernel bwd GB/s | fraction of peak (fwd, bwd) | vs best torch | vs compile |")
    print("|---|" + "---:|" * (2 * len(paths) + 5))
    for row in result["ops"]:
        cells = [f"{ms(row[p]['forward'])} | {ms(row[p]['forward_backward'])}" for p in paths]
        frac = (f"{row['kernel_forward_fraction_of_peak']:.0%}, {row['kernel_backward_fraction_of_peak']:.0%}"
                if "kernel_forward_fraction_of_peak" in row else "n/a")
        vs_compile = f"{row['speedup_vs_compile']:.2f}" if "speedup_vs_compile" in row else "n/a"
        print(f"| {row['op']} | " + " | ".join(cells) + f" | {row['kernel_forward_bytes_per_s'] / 1e9:,.0f} | "
              f"{row['kernel_backward_bytes_per_s'] / 1e9:,.0f} | {frac} | {row['speedup_vs_best_torch']:.2f} | "
              f"{vs_compile} |")
    print("\n## Training steps (ms, median over rounds [min-max])\n\n| model/mode | step |\n|---|---:|")
    for name, t in result["steps"].items():
        cell = (f"{t['median_s'] * 1e3:.1f} [{t['min_s'] * 1e3:.1f}-{t['max_s'] * 1e3:.1f}]" if "median_s" in t
                else f"not measured: {t['skipped']}")
        print(f"| {name} | {cell} |")
    if result["ratios"]:
        print("\n## Ratios (goals: nGPT/GPT <= 1.05 with the kernels; Pattention FFN/MLP <= 1.02)\n")
        for key, value in result["ratios"].items():
            print(f"- {key}: {value:.3f}")
    print(f"\n## Verdict (keep: fwd+bwd device time >= {result['min_speedup']}x compiled torch, and the compiled "
          f"step with the kernel no slower)\n")
    print("| kernel | vs compiled torch (op) | step model | vs compiled step | verdict |\n|---|---:|---|---:|---|")
    fmt = lambda v: "n/a" if v is None else f"{v:.2f}"
    for op, v in result["verdicts"].items():
        print(f"| {op} | {fmt(v['op_speedup_vs_compile'])} | {v['step_model']} | "
              f"{fmt(v['step_speedup_vs_compile'])} | {'(dry run)' if result['dry'] else v['verdict']} |")
    if result["dry"]:
        print("\nDry run: tiny shapes (and on CPU Triton's interpreter), so none of these figures means anything.")
        return
    entry = {row["op"]: round(row["speedup_vs_best_torch"], 2) for row in result["ops"]}
    print(f"\nFor arch_plugins/kernels/measured.py (measured {result['date']}, {result['device']}):\n"
          f"    {result['device']!r}: {entry},")


def parse_args(argv: list[str] | None):
    """The options; a bad one is one ``error:`` line and exit code 2 (argparse's own), checked before any work."""
    from arch_plugins.kernels import dispatch

    p = OneLineArgumentParser(prog="-m benchmarks.kernels", description=__doc__.splitlines()[0])
    for name, default in [("d_model", 1024), ("heads", 16), ("layers", 2), ("seq", 1024), ("batch", 8),
                          ("vocab", 32000), ("reps", 50), ("warmup", 5), ("rounds", 5), ("sinkhorn_iters", 20),
                          ("depth_sources", 13)]:
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--ops", type=lambda v: _choices(v, dispatch.OPS, "--ops"), default=list(dispatch.OPS),
                   help=f"comma-separated, of {', '.join(dispatch.OPS)} (default: all)")
    p.add_argument("--models", type=lambda v: _choices(v, tuple(MODEL_OPS), "--models"), default=list(MODEL_OPS),
                   help=f"the whole steps, comma-separated, of {', '.join(MODEL_OPS)} (default: all)")
    p.add_argument("--goals", action="store_true", help="also eager steps and issue 16's goals (GPT, dense MLP)")
    p.add_argument("--budget_s", type=float, default=60.0,
                   help="no model's step is compiled after this many seconds (default 60, so that the run, its "
                        "last compiles and the timed rounds end near 90 s)")
    p.add_argument("--no_compile", action="store_true", help="skip the torch.compile paths")
    p.add_argument("--dry", action="store_true", help="tiny shapes, every path once: checks that it runs")
    p.add_argument("--out", type=Path, default=None, help="where the JSON goes (default: benchmarks/results/)")
    args = p.parse_args(argv)
    for name in ("layers", "seq", "batch", "reps", "rounds", "sinkhorn_iters", "depth_sources"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    return args


def _choices(value: str, allowed: tuple[str, ...], flag: str) -> list[str]:
    chosen = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [v for v in chosen if v not in allowed]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"{flag} takes a comma-separated list of {', '.join(allowed)}; "
                                         f"got {value!r}")
    return chosen


@one_line_errors
def main(argv: list[str] | None = None) -> int:
    run(argv)
    return 0


def run(argv: list[str] | None = None) -> dict:
    """The benchmark; bad input raises UserInputError (``main`` makes it one ``error:`` line, exit code 2)."""
    started = time.perf_counter()
    args = parse_args(argv)
    from arch_plugins.kernels import dispatch, measured

    if dispatch.triton_import_error() is not None:
        raise UserInputError(f"triton does not import here ({dispatch.triton_import_error()}); the kernels "
                             f"benchmark needs it: install triton (Linux)")
    cuda = torch.cuda.is_available()
    if not cuda and not args.dry:
        raise UserInputError("benchmarks/kernels.py measures Triton kernels on a CUDA GPU, and there is none here; "
                             "run it on a GPU, or with --dry to check that it runs (tiny shapes, Triton's "
                             "interpreter)")
    if not cuda and not dispatch.interpreting():
        # The interpreter must be on before triton is first imported (lightning imports it): start over.
        os.execve(sys.executable, [sys.executable, "-m", "benchmarks.kernels", *(argv or sys.argv[1:])],
                  {**os.environ, "TRITON_INTERPRET": "1"})
    if args.dry:
        args.d_model, args.heads, args.layers, args.seq, args.batch, args.vocab = 32, 2, 1, 8, 2, 64
        args.reps, args.warmup, args.rounds = 2, 1, 2
        args.sinkhorn_iters, args.depth_sources = 2, 3  # the interpreter's Sinkhorn backward grows as iters^2
    device = torch.device("cuda" if cuda else "cpu")
    timer = Timer(device, args.reps, args.warmup)
    name = torch.cuda.get_device_name(device) if cuda else "cpu (Triton interpreter)"
    print(f"{name}: torch {torch.__version__}, d_model {args.d_model}, {args.layers} layers, {args.heads} heads, "
          f"{args.batch} x {args.seq} tokens, bf16 autocast{' (dry run: no figures)' if args.dry else ''}", flush=True)
    peak = peak_bandwidth(device, timer)
    print("per-op device times", flush=True)
    ops = measure_ops(args, device, DeviceClock(device, args.reps), peak)
    step_timer = Timer(device, 1 if args.dry else 3, 0)
    print("training steps", flush=True)
    steps = measure_steps(args, device, step_timer, deadline=started + args.budget_s)
    result = {"device": name, "dry": args.dry, "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
              "python": platform.python_version(), "args": vars(args) | {"out": None}, "peak": peak, "ops": ops,
              "steps": steps, "ratios": ratios(steps), "goals": GOALS, "min_speedup": measured.AUTO_MIN_SPEEDUP,
              "verdicts": verdicts(ops, steps, measured.AUTO_MIN_SPEEDUP)}
    report(result)
    result["wall_s"] = time.perf_counter() - started
    print(f"\n{result['wall_s']:.0f} s in all")
    if not args.dry:
        out = args.out or RESULTS / f"kernels_{name.replace(' ', '_').replace('/', '_')}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1))
        print(f"wrote {out}")
    return result


if __name__ == "__main__":
    raise SystemExit(main())
