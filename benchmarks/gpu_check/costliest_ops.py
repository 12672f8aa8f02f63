"""Which ops a variant's step spends its time on beyond the baseline's: what the page names where a target is missed.

A few steps of each run under ``torch.profiler``; per op (a kernel's name on a GPU, an aten op's on a CPU) the self
time per step is summed, device time on a GPU and CPU time on a CPU (where the CPU is the device). The ops the variant
spends the most on beyond what the baseline spends on the same name are its cost: under compile the fused kernels
are named after what they fuse (``triton_per_fused_..._rms_norm_...``), so a plugin's own kernels show as new names.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from benchmarks.gpu_check import measure


def ms_per_op(step: Callable[[], torch.Tensor], device: torch.device, steps: int = 2) -> dict[str, float]:
    """Self time per step of each op, in ms, over ``steps`` profiled steps."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    measure.sync(device)
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        measure.sync(device)
    totals = {}
    for event in prof.key_averages():
        # microseconds; the device's attribute was named after CUDA before torch 2.4
        us = (getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0)) if cuda \
            else event.self_cpu_time_total
        if us > 0:
            totals[event.key] = us / steps / 1e3
    return totals


def extra(variant: dict[str, float], baseline: dict[str, float], top: int = 3) -> list[list]:
    """The ``top`` ops the variant spends the most on beyond the baseline: [[name, extra ms per step], ...]."""
    gaps = {name: ms - baseline.get(name, 0.0) for name, ms in variant.items()}
    return [[name, gap] for name, gap in sorted(gaps.items(), key=lambda kv: -kv[1])[:top] if gap > 0]
