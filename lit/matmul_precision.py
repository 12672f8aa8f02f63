"""TF32 for fp32 runs on CUDA: the one place the project changes torch's float32 matmul precision.

An fp32 recipe on an Ampere or Hopper GPU otherwise runs its matrix products on the CUDA cores: 67 TFLOP/s on an
H100 SXM against 495 with TF32 tensor cores (``lit/device_peaks.py``). TF32 keeps fp32's range and 10 of its 23
mantissa bits, the trade nanoGPT, torchtitan and Lightning's own hint make for training; mixed-precision runs
(bf16, fp16) do their products in the low precision anyway and are left alone. A user who set another precision
before (``torch.set_float32_matmul_precision``) keeps it; on a CPU nothing changes, so CPU results stay bit-identical.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)


def allow_tf32(precision: str, device: torch.device) -> bool:
    """Lets fp32 matrix products use TF32 (``"high"``) for an fp32 ``precision`` on a CUDA ``device``, unless the
    precision was already changed from torch's default; True when it changed it here."""
    if device.type != "cuda" or not str(precision).startswith("32"):
        return False
    if torch.get_float32_matmul_precision() != "highest":
        return False
    torch.set_float32_matmul_precision("high")
    log.info("fp32 run on CUDA: matrix products use TF32 tensor cores (torch.set_float32_matmul_precision('high'); "
             "lit/matmul_precision.py)")
    return True
