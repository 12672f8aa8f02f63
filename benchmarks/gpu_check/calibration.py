"""Stage A: the device and its measured peaks, beside the spec sheet's (``lit/device_peaks.py``).

Every ratio later in the check divides by a peak: MFU by the bf16 matrix peak, a kernel's share by the memory
bandwidth. The spec sheet's figure is the convention (torchtitan, nanoGPT); the measured one (a large bf16 GEMM, a
TF32 GEMM, a 1 GiB device-to-device copy) says what this particular card, at its clocks and power cap, can do.
"""

from __future__ import annotations

import platform
import shutil
import subprocess
from importlib import metadata

import torch

from benchmarks.kernels import Timer
from lit.device_peaks import peak_bandwidth, peak_flops

SMI_FIELDS = ("name", "driver_version", "clocks.sm", "clocks.max.sm", "clocks.mem", "clocks.max.mem", "power.draw",
              "power.limit", "temperature.gpu", "memory.total")


def versions() -> dict[str, str | None]:
    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    return {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "triton": version("triton"), "lightning": version("lightning")}


def nvidia_smi() -> dict[str, str] | str:
    """What ``nvidia-smi --query-gpu`` says about GPU 0 (clocks, power, temperature), or why it could not."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return "nvidia-smi not found"
    try:
        out = subprocess.run([exe, f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"nvidia-smi failed: {exc}"
    if out.returncode != 0:
        return f"nvidia-smi exit {out.returncode}: {out.stderr.strip()[:200]}"
    values = [v.strip() for v in out.stdout.splitlines()[0].split(",")]
    return dict(zip(SMI_FIELDS, values, strict=False))


def gemm_flops(n: int, dtype: torch.dtype, device: torch.device, timer: Timer) -> float:
    """FLOP/s of an n x n x n matrix product in ``dtype`` (2 n^3 FLOPs per product)."""
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, generator=g, device=device).to(dtype)
    b = torch.randn(n, n, generator=g, device=device).to(dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    t = timer(lambda: torch.mm(a, b, out=out))["median_s"]
    return 2 * n ** 3 / t


def copy_bandwidth(nbytes: int, device: torch.device, timer: Timer) -> float:
    """Bytes/s of a device-to-device copy (each byte read once and written once)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    t = timer(lambda: dst.copy_(src))["median_s"]
    return 2 * nbytes / t


def run(ctx, clock, out: dict) -> None:
    device, dry = ctx.device, ctx.dry
    name = ctx.device_name
    out.update(device=name, versions=versions())
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        out.update(sms=props.multi_processor_count, memory_gib=props.total_memory / (1 << 30),
                   capability=f"{props.major}.{props.minor}", nvidia_smi=nvidia_smi())
    n = 256 if dry else 8192
    nbytes = (16 << 20) if dry else (1 << 30)
    timer = Timer(device, reps=3 if dry else 20, warmup=1 if dry else 3)
    precision = torch.get_float32_matmul_precision()
    try:
        bf16 = gemm_flops(n, torch.bfloat16, device, timer)
        torch.set_float32_matmul_precision("high")  # TF32 tensor cores for fp32 products (no effect on CPU)
        tf32 = gemm_flops(n, torch.float32, device, timer)
    finally:
        torch.set_float32_matmul_precision(precision)
    copy = copy_bandwidth(nbytes, device, timer)
    spec = {"bf16_flops": peak_flops(name, torch.bfloat16), "tf32_flops": peak_flops(name, torch.float32, tf32=True),
            "bandwidth_bytes_per_s": peak_bandwidth(name)}
    measured = {"bf16_flops": bf16, "tf32_flops": tf32, "bandwidth_bytes_per_s": copy,
                "gemm_n": n, "copy_bytes": nbytes}
    out.update(spec=spec, measured=measured,
               measured_over_spec={k: measured[k] / spec[k] if spec[k] else None for k in spec})
    ctx.peaks = {"flops_spec": spec["bf16_flops"], "flops_measured": bf16,
                 "bandwidth_spec": spec["bandwidth_bytes_per_s"], "bandwidth_measured": copy}
