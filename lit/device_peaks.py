"""Spec-sheet peaks of the accelerators this project runs on: dense matrix FLOP/s per dtype and memory bandwidth.

MFU (model FLOPs utilisation) is the FLOPs the model counts per second over the device's peak; a kernel's share of
peak bandwidth is its bytes per second over the device's bandwidth. Both need the peak, and a device reports only its
name (``torch.cuda.get_device_name``), so the peaks are a table keyed by name, with the vendor's spec sheet as the
source of each figure (datasheets state the tensor-core rates "with sparsity"; the dense rate, the one a transformer
runs at, is half of that, and is what is tabulated here, as torchtitan's ``get_peak_flops`` and nanoGPT's MFU do).

A device that is not in the table (a CPU, a consumer card, a future part) gets ``None``: no MFU is better than an MFU
against a guessed peak.

Sources (each row's figures below come from the sheet named in its comment):
- H100 / H200: NVIDIA H100 datasheet (nvidia.com/en-us/data-center/h100, "H100 SXM / H100 NVL" columns) and H200
  datasheet (nvidia.com/en-us/data-center/h200, "H200 SXM / H200 NVL"). The H100 PCIe figures are from the earlier
  H100 datasheet's "H100 PCIe" column.
- A100: NVIDIA A100 datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf).
- L4: NVIDIA L4 datasheet; L40S: NVIDIA L40S datasheet; A10: NVIDIA A10 datasheet.
- A10G: AWS publishes no sheet for this G5-only part; the figures are those Baseten lists beside the A10's
  (baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference): fewer tensor FLOPs, the same 600 GB/s.
- B200: NVIDIA HGX B200 datasheet figures for 8 GPUs, divided by 8.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

TERA = 1e12


@dataclass(frozen=True)
class DevicePeaks:
    """Dense peaks of one device: FP32 on CUDA cores, TF32, BF16/FP16 on tensor cores (FLOP/s); bytes/s."""

    fp32: float
    tf32: float
    bf16: float  # fp16 has the same dense tensor-core rate on every part tabulated here
    bandwidth: float


# Matched in order, first hit wins: the more specific names (NVL, PCIe, 40GB) come before the general ones.
# Each pattern is matched case-insensitively against torch.cuda.get_device_name(), e.g. "NVIDIA H100 80GB HBM3"
# (SXM), "NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA H200", "NVIDIA A100-SXM4-80GB", "NVIDIA A100-PCIE-40GB",
# "NVIDIA A100 80GB PCIe", "NVIDIA L4", "NVIDIA L40S", "NVIDIA A10G", "NVIDIA A10", "NVIDIA B200".
_TABLE: list[tuple[str, DevicePeaks]] = [
    # H200 NVL: FP32 60 TF; TF32 835 / BF16 1,671 TF with sparsity; 4.8 TB/s (H200 datasheet).
    (r"\bH200\b.*\bNVL\b", DevicePeaks(60 * TERA, 417.5 * TERA, 835.5 * TERA, 4.8e12)),
    # H200 SXM: FP32 67 TF; TF32 989 / BF16 1,979 TF with sparsity; 4.8 TB/s (H200 datasheet).
    (r"\bH200\b", DevicePeaks(67 * TERA, 494.5 * TERA, 989.5 * TERA, 4.8e12)),
    # H100 NVL: FP32 60 TF; TF32 835 / BF16 1,671 TF with sparsity; 3.9 TB/s (H100 datasheet).
    (r"\bH100\b.*\bNVL\b", DevicePeaks(60 * TERA, 417.5 * TERA, 835.5 * TERA, 3.9e12)),
    # H100 PCIe (80 GB HBM2e): FP32 51 TF; TF32 756 / BF16 1,513 TF with sparsity; 2.0 TB/s (H100 datasheet).
    (r"\bH100\b.*\bPCIE\b", DevicePeaks(51 * TERA, 378 * TERA, 756.5 * TERA, 2.0e12)),
    # H100 SXM: FP32 67 TF; TF32 989 / BF16 1,979 TF with sparsity; 3.35 TB/s (H100 datasheet).
    (r"\bH100\b", DevicePeaks(67 * TERA, 494.5 * TERA, 989.5 * TERA, 3.35e12)),
    # A100 40 GB (SXM and PCIe): FP32 19.5 TF, TF32 156 TF, BF16 312 TF dense; 1,555 GB/s (A100 datasheet).
    (r"\bA100\b.*\b40GB\b", DevicePeaks(19.5 * TERA, 156 * TERA, 312 * TERA, 1.555e12)),
    # A100 80 GB PCIe: the same rates; 1,935 GB/s (A100 datasheet).
    (r"\bA100\b.*\bPCIE\b", DevicePeaks(19.5 * TERA, 156 * TERA, 312 * TERA, 1.935e12)),
    # A100 80 GB SXM: the same rates; 2,039 GB/s (A100 datasheet).
    (r"\bA100\b", DevicePeaks(19.5 * TERA, 156 * TERA, 312 * TERA, 2.039e12)),
    # L40S: FP32 91.6 TF; TF32 183 TF, BF16 362.05 TF dense; 864 GB/s (L40S datasheet).
    (r"\bL40S\b", DevicePeaks(91.6 * TERA, 183 * TERA, 362.05 * TERA, 864e9)),
    # L4: FP32 30.3 TF; TF32 120 / BF16 242 TF with sparsity; 300 GB/s (L4 datasheet).
    (r"\bL4\b", DevicePeaks(30.3 * TERA, 60 * TERA, 121 * TERA, 300e9)),
    # A10G (AWS G5): FP32 35 TF, TF32 35 TF, BF16 70 TF; 600 GB/s (Baseten's table, see the module docstring).
    (r"\bA10G\b", DevicePeaks(35 * TERA, 35 * TERA, 70 * TERA, 600e9)),
    # A10: FP32 31.2 TF; TF32 62.5 TF, BF16 125 TF dense; 600 GB/s (A10 datasheet).
    (r"\bA10\b", DevicePeaks(31.2 * TERA, 62.5 * TERA, 125 * TERA, 600e9)),
    # B200 (HGX B200, 8 GPUs): FP32 600 TF, TF32 18 PF / BF16 36 PF with sparsity, 64 TB/s; per GPU below.
    (r"\bB200\b", DevicePeaks(75 * TERA, 1125 * TERA, 2250 * TERA, 8.0e12)),
]


def device_peaks(device_name: str) -> DevicePeaks | None:
    """The peaks of the device called ``device_name`` (as CUDA reports it), or None when it is not tabulated."""
    for pattern, peaks in _TABLE:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            return peaks
    return None


def peak_flops(device_name: str, dtype: torch.dtype, *, tf32: bool | None = None) -> float | None:
    """Dense peak matrix FLOP/s of ``device_name`` for matrix products in ``dtype``; None if unknown.

    For float32 the peak depends on whether matrix products may use TF32 tensor cores: ``tf32`` says so; left as
    None it follows torch's current setting (``torch.get_float32_matmul_precision() != "highest"``), which is what
    the run's matrix products actually do. Other dtypes (float64, float8) are not tabulated: None.
    """
    peaks = device_peaks(device_name)
    if peaks is None:
        return None
    if dtype in (torch.bfloat16, torch.float16):
        return peaks.bf16
    if dtype == torch.float32:
        if tf32 is None:
            tf32 = torch.get_float32_matmul_precision() != "highest"
        return peaks.tf32 if tf32 else peaks.fp32
    return None


def peak_bandwidth(device_name: str) -> float | None:
    """Peak memory bandwidth of ``device_name`` in bytes/s (spec sheet, decimal units); None if unknown."""
    peaks = device_peaks(device_name)
    return None if peaks is None else peaks.bandwidth
