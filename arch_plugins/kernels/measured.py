"""What ``kernel: auto`` decides from: per GPU and per op, the measured speedup of the Triton kernel.

An entry is the ratio (time of the faster torch path) / (time of the Triton kernel) for the op's forward and
backward at the benchmark's shapes (d_model 1024, bf16), where the faster torch path is the better of eager and
``torch.compile`` of that op. ``python -m benchmarks.kernels`` measures it on a GPU and prints the entry to paste
here, with its provenance in a comment. The key is the name ``torch.cuda.get_device_name()`` reports.

Measured so far on one GPU (docs/performance/gpu.md): on an H200 every kernel is slower than the better torch path,
so ``auto`` picks torch there, as it does on any GPU without an entry.
"""

from __future__ import annotations

# {device name: {op name: speedup}}; op names are those of arch_plugins.kernels.dispatch.OPS.
MEASURED_SPEEDUPS: dict[str, dict[str, float]] = {
    # python -m benchmarks.gpu_check (stage E), 2026-11-27, torch 2.11.0+cu130, triton 3.6.0
    "NVIDIA H200": {"row_l2_normalize": 0.47, "qk_normalize": 0.57, "ngpt_stream_update": 0.70,
                    "pattention_theta": 0.63},
}

# ``auto`` takes the kernel only when it was measured at least this much faster: below it, timing noise and the
# risk of a second code path outweigh the gain.
AUTO_MIN_SPEEDUP = 1.05
