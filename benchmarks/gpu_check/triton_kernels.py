"""Stage E: the Triton kernels against eager and compiled torch, in GB/s and as a share of peak bandwidth.

``benchmarks.kernels.measure_ops`` (the kernels benchmark's per-op part, at reduced repetitions) times each fused
op's forward and forward+backward for the eager torch path, ``torch.compile`` of it and the Triton kernel on device
time (``benchmarks.kernels.DeviceClock``: a captured CUDA graph replayed, so no host work is counted; the first
run timed each call between CUDA events, which counted the backward's host work); its bytes are what the op must
move (every input read once, every output written once). The shares are against the spec sheet's bandwidth and
against stage A's measured copy. ``nn.RMSNorm`` eager and compiled are timed the same way, as a reference for what
a bandwidth-bound op reaches. The result ends with the ``MEASURED_SPEEDUPS`` entry to paste into
``arch_plugins/kernels/measured.py`` (what ``kernel: auto`` reads).

This stage measures the four kernels it measured from the start (nGPT's and Pattention's). The fused Sinkhorn and
depth softmax, with the whole-step comparison and the verdict per kernel, are ``python -m benchmarks.kernels``.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import torch

from benchmarks.gpu_check import measure
from benchmarks.gpu_check.budget import SKIPPED
from benchmarks.kernels import DeviceClock, measure_ops

COMPILE_ESTIMATE_S = 45.0  # inductor on four small ops, forward and backward, plus the timing itself


STAGE_OPS = ["row_l2_normalize", "qk_normalize", "ngpt_stream_update", "pattention_theta"]


def rmsnorm_reference(args, device, timer: DeviceClock, peak: float | None) -> dict:
    """``nn.RMSNorm`` over (tokens, d) in bf16, eager and compiled: forward GB/s (read x once, write y once)."""
    n, d = args.batch * args.seq, args.d_model
    norm = torch.nn.RMSNorm(d, device=device, dtype=torch.bfloat16)
    x = torch.randn(n, d, device=device, dtype=torch.bfloat16)
    nbytes = 2 * n * d * 2
    out = {}
    paths = [("eager", norm)] + ([] if args.no_compile else [("compile", torch.compile(norm, dynamic=False))])
    for path, fn in paths:
        with torch.no_grad():
            t = timer(lambda fn=fn: fn(x))
        out[path] = {"forward": t, "bytes_per_s": nbytes / t["median_s"],
                     "fraction_of_peak": nbytes / t["median_s"] / peak if peak else None}
    return out


def run(ctx, clock, out: dict) -> None:
    from arch_plugins.kernels import dispatch

    device, dry = ctx.device, ctx.dry
    if dispatch.triton_import_error() is not None:
        out["status"] = f"not measured: triton does not import ({dispatch.triton_import_error()})"
        return
    if device.type != "cuda" and not dispatch.interpreting():
        out["status"] = ("not measured: the Triton kernels need CUDA, or TRITON_INTERPRET=1 set before triton is "
                         "first imported (python -m benchmarks.gpu_check --dry sets it)")
        return
    # Compiling the torch side of the four ops (forward and backward) is most of this stage's time on a GPU: it
    # is left out, and said so, when the stage's time left would not cover it.
    no_compile = not clock.fits(COMPILE_ESTIMATE_S)
    shape = dict(batch=2, seq=8, d_model=32, heads=2) if dry else dict(batch=8, seq=1024, d_model=1024, heads=16)
    args = SimpleNamespace(**shape, no_compile=no_compile, ops=STAGE_OPS, sinkhorn_iters=20, depth_sources=13)
    if no_compile:
        out["compiled_torch"] = SKIPPED
    timer = DeviceClock(device, reps=2 if dry else 20)
    spec, copy = ctx.peaks.get("bandwidth_spec"), ctx.peaks.get("bandwidth_measured")
    peak = {"spec_bytes_per_s": spec, "copy_bytes_per_s": copy}
    t0 = time.perf_counter()
    rows = measure_ops(args, device, timer, peak)  # its fractions are of the spec (or the copy, where no spec)
    for row in rows:
        for direction in ("forward", "backward"):
            rate = row[f"kernel_{direction}_bytes_per_s"]
            row[f"kernel_{direction}_fraction_of_spec"] = rate / spec if spec else None
            row[f"kernel_{direction}_fraction_of_copy"] = rate / copy if copy else None
        for path in ("eager", "compile"):
            if path in row:
                t = row[path]["forward"]["median_s"]
                row[f"{path}_forward_bytes_per_s"] = row["bytes_forward"] / t
    out.update(shape=shape | {"no_compile": no_compile}, ops=rows, ops_wall_s=time.perf_counter() - t0)
    if clock.fits(2 if dry else (15 if not no_compile else 3)):
        try:
            out["rmsnorm_reference"] = rmsnorm_reference(args, device, timer, spec or copy)
        except Exception as exc:
            out["rmsnorm_reference"] = {"status": "failed", "error": measure.error_text(exc)}
    entry = {row["op"]: round(row["speedup_vs_best_torch"], 2) for row in rows}
    out["measured_speedups_entry"] = None if dry else {ctx.device_name: entry}
    out["measured_speedups_line"] = None if dry else (
        f"    {ctx.device_name!r}: {entry},  # python -m benchmarks.gpu_check, {time.strftime('%Y-%m-%d')}")
