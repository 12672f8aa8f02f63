"""Training throughput over the log window, and the model FLOPs utilisation (MFU) it amounts to.

``train/<items>_per_s`` is the items (tokens, images) trained since the previous log step, over all processes,
divided by the wall time since then. Both ends of the window are taken right after the log step's host-device sync
(the logged metrics are read there), so the host clock and the device agree at both ends and the rate is the
device's, even though no step in between waits for the device. A one-step sample (what was logged before) is only
right when every step syncs, and is noisy; a window of ``log_every_n_steps`` steps is neither.

A window that validation or the end of an epoch interrupts is dropped, not stretched: the next one starts when
training resumes, so the time spent elsewhere is not counted as training.

``train/mfu`` is torchtitan's definition: the model's training FLOPs per item (``lit/compute.py``, counted on the
model as built) times items per second per device, over the device's dense peak for the run's matmul dtype
(``lit/device_peaks.py``). It is logged only where the peak is known (not on a CPU).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from lit.device_peaks import peak_flops


class ThroughputWindow:
    """Items per second between consecutive ``read`` calls; ``add`` counts items, ``drop`` discards a window."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self._clock = clock
        self._start: float | None = None
        self._items = 0

    def start(self) -> None:
        """Opens a window now (training starts or resumes)."""
        self._start, self._items = self._clock(), 0

    def drop(self) -> None:
        """Discards the open window (training is interrupted); the next ``start`` opens a new one."""
        self._start, self._items = None, 0

    def add(self, items: int) -> None:
        self._items += items

    def read(self) -> float | None:
        """Items per second since the window opened, and a new window from now; None when no window was open."""
        now = self._clock()
        rate = self._items / (now - self._start) if self._start is not None and now > self._start else None
        self._start, self._items = now, 0
        return rate


def mfu(flops_per_item: float, items_per_s: float, devices: int, peak: float) -> float:
    """Model FLOPs utilisation: achieved training FLOP/s per device over the device's peak FLOP/s."""
    return flops_per_item * items_per_s / devices / peak


def matmul_dtype(precision: str) -> torch.dtype | None:
    """The dtype the matrix products run in under a Lightning ``precision`` setting; None if not tabulated."""
    precision = str(precision)
    if precision.startswith("bf16"):
        return torch.bfloat16
    if precision.startswith("16"):
        return torch.float16
    if precision.startswith("32"):
        return torch.float32
    return None


def device_name(device: torch.device) -> str | None:
    """The accelerator's name as CUDA reports it (``NVIDIA H100 80GB HBM3``); None for a CPU or other device."""
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_name(device)


def device_peak(device: torch.device, precision: str) -> float | None:
    """The dense peak FLOP/s of ``device`` for the run's ``precision``; None where unknown (then no MFU)."""
    name, dtype = device_name(device), matmul_dtype(precision)
    if name is None or dtype is None:
        return None
    return peak_flops(name, dtype)
