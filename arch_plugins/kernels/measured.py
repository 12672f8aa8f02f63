"""What ``kernel: auto`` decides from: per GPU and per op, the measured speedup of the Triton kernel.

An entry is the ratio (time of the faster torch path) / (time of the Triton kernel) for the op's forward and
backward at the benchmark's shapes (d_model 1024, bf16), where the faster torch path is the better of eager and
``torch.compile`` of that op. ``python -m benchmarks.kernels`` measures it on device time (a captured CUDA graph
replayed) and prints the entry to paste here, with its provenance in a comment, beside a verdict per kernel: add
an op only where that verdict is ``keep``. The key is the name ``torch.cuda.get_device_name()`` reports.

The one row so far (an H200) came from CUDA events around each call, which counted the backward's host work
(docs/kernels.md): it says every kernel is slower, and keeps ``auto`` on torch there, as on any GPU without a row,
until a device-time run replaces it. No GPU has an entry for ``sinkhorn_knopp`` or ``depth_softmax``.
"""

from __future__ import annotations

# {device name: {op name: speedup}}; op names are those of arch_plugins.kernels.dispatch.OPS.
MEASURED_SPEEDUPS: dict[str, dict[str, float]] = {
    # python -m benchmarks.gpu_check (stage E), 2026-11-27, torch 2.11.0+cu130, triton 3.6.0; CUDA events around
    # each call after an L2 flush, so host time too (shared/specs/gpu-plugins.md section 3)
    "NVIDIA H200": {"row_l2_normalize": 0.47, "qk_normalize": 0.57, "ngpt_stream_update": 0.70,
                    "pattention_theta": 0.63},
}

# ``auto`` takes the kernel only when it was measured at least this much faster: below it, timing noise and the
# risk of a second code path outweigh the gain.
AUTO_MIN_SPEEDUP = 1.05
