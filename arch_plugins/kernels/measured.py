"""What ``kernel: auto`` decides from: per GPU and per op, the measured speedup of the Triton kernel.

An entry is the ratio (time of the faster torch path) / (time of the Triton kernel) for the op's forward and
backward at the benchmark's shapes (d_model 1024, bf16), where the faster torch path is the better of eager and
``torch.compile`` of that op. ``python -m benchmarks.kernels`` measures it on a GPU and prints the entry to paste
here, with its provenance in a comment. The key is the name ``torch.cuda.get_device_name()`` reports.

Empty: no GPU has measured these kernels yet, so ``auto`` picks torch everywhere.
"""

from __future__ import annotations

# {device name: {op name: speedup}}; op names are those of arch_plugins.kernels.dispatch.OPS.
MEASURED_SPEEDUPS: dict[str, dict[str, float]] = {}

# ``auto`` takes the kernel only when it was measured at least this much faster: below it, timing noise and the
# risk of a second code path outweigh the gain.
AUTO_MIN_SPEEDUP = 1.05
