"""Which path an op takes (the ``kernel`` option of a plugin) and how a Triton kernel is launched.

The rule, in one place:

- ``torch``: the plugin's eager PyTorch code, always.
- ``triton``: the Triton kernel, always. Needs triton installed (checked when the plugin is built) and CUDA
  tensors (checked at the first forward), or Triton's interpreter (``TRITON_INTERPRET=1``: for tests, on CPU,
  about 1000x slower).
- ``auto`` (the default): the Triton kernel only on a CUDA device on which it was measured faster than torch by
  at least ``AUTO_MIN_SPEEDUP`` (``arch_plugins.kernels.measured``); torch everywhere else. No op in the table
  reaches that yet, so ``auto`` is torch today.

Each op is a ``torch.library.custom_op`` (``arch_plugins::<op>``, with a fake for shapes and an autograd
formula that calls a backward custom op): torch.compile keeps it as one opaque node, so ``kernel: triton`` breaks
no graph and Inductor cannot re-fuse through the kernel's casts.

triton stays an optional import: this module never imports it at import time, and the op files guard their
kernel sources behind ``tl is not None``.
"""

from __future__ import annotations

import contextlib
import functools
import os

import torch

from arch_plugins.kernels import measured
from arch_plugins.registry import PluginError

KERNEL_CHOICES = ("auto", "triton", "torch")

# The fused ops, by the names the measured table and the benchmark use.
ROW_L2_NORMALIZE = "row_l2_normalize"
QK_NORMALIZE = "qk_normalize"
NGPT_STREAM_UPDATE = "ngpt_stream_update"
PATTENTION_THETA = "pattention_theta"
SINKHORN_KNOPP = "sinkhorn_knopp"
DEPTH_SOFTMAX = "depth_softmax"
OPS = (ROW_L2_NORMALIZE, QK_NORMALIZE, NGPT_STREAM_UPDATE, PATTENTION_THETA, SINKHORN_KNOPP, DEPTH_SOFTMAX)

# A row is reduced inside one program (its whole width in registers): wider rows take the torch path.
MAX_ROW_WIDTH = 1 << 16


@functools.cache
def triton_import_error() -> str | None:
    """Why ``import triton`` fails here (one line), or None when it works."""
    try:
        import triton  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install raising anything else on import
        return f"{type(exc).__name__}: {exc}".splitlines()[0]
    return None


def check_kernel(kernel: str) -> str:
    """Validate a plugin's ``kernel`` option when the plugin is built (a ValueError becomes a one-line PluginError)."""
    if kernel not in KERNEL_CHOICES:
        raise ValueError(f"kernel must be one of {', '.join(KERNEL_CHOICES)}, got {kernel!r}")
    if kernel == "triton" and triton_import_error() is not None:
        raise ValueError(f"kernel: triton needs the triton package, which does not import here "
                         f"({triton_import_error()}); install triton (Linux) or use kernel: auto")
    if kernel == "triton" or (kernel == "auto" and auto_may_pick_triton() and triton_import_error() is None):
        register_ops()
    return kernel


def register_ops() -> None:
    """Import the op files, which register the kernels as ``torch.library`` custom ops (``arch_plugins::*``).

    Done when a plugin that may run them is built, so that torch.compile never meets a first import (and a
    registration) while it traces a forward.
    """
    import importlib

    for op in OPS:
        importlib.import_module(f"arch_plugins.kernels.{op}")


def interpreting() -> bool:
    """Whether Triton's interpreter is on (TRITON_INTERPRET, read now: kernels are built per mode)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


def triton_runs_on(x: torch.Tensor) -> bool:
    """Whether an op that carries its torch path inside (sinkhorn_knopp, depth_softmax) runs its Triton kernel on
    ``x``: a CUDA tensor or the interpreter, triton importable, and not float64 (the kernels compute in fp32)."""
    return ((x.is_cuda or interpreting()) and x.dtype != torch.float64 and triton_import_error() is None)


def auto_may_pick_triton(table: dict[str, dict[str, float]] | None = None, min_speedup: float | None = None) -> bool:
    """Whether ``auto`` picks a kernel on any GPU measured (if not, the ops are never registered for it)."""
    table = measured.MEASURED_SPEEDUPS if table is None else table
    min_speedup = measured.AUTO_MIN_SPEEDUP if min_speedup is None else min_speedup
    return any(speedup >= min_speedup for ops in table.values() for speedup in ops.values())


def auto_picks_triton(op: str, device_name: str, table: dict[str, dict[str, float]] | None = None,
                      min_speedup: float | None = None) -> bool:
    """The ``auto`` rule on one CUDA device: measured there, and faster by at least the threshold."""
    table = measured.MEASURED_SPEEDUPS if table is None else table
    min_speedup = measured.AUTO_MIN_SPEEDUP if min_speedup is None else min_speedup
    return table.get(device_name, {}).get(op, 0.0) >= min_speedup


@functools.cache
def _cuda_device_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


def use_triton(kernel: str, op: str, x: torch.Tensor) -> bool:
    """Whether this call of ``op`` on ``x`` runs the Triton kernel, per the plugin's ``kernel`` option."""
    if kernel == "torch":
        return False
    if x.shape[-1] > MAX_ROW_WIDTH:
        if kernel == "triton":
            raise PluginError(f"kernel: triton: {op} reduces rows of at most {MAX_ROW_WIDTH} elements in one "
                              f"program, got {x.shape[-1]}; use kernel: auto or torch")
        return False
    if kernel == "triton":
        if not x.is_cuda and not interpreting():
            raise PluginError(f"kernel: triton runs on CUDA tensors, but {op} got one on {x.device}; use kernel: "
                              f"auto (torch off CUDA), or TRITON_INTERPRET=1 for Triton's slow CPU interpreter")
        return True
    if not auto_may_pick_triton() or not x.is_cuda or triton_import_error() is not None:
        return False  # auto, in every case nothing was measured for
    return auto_picks_triton(op, _cuda_device_name(x.device.index if x.device.index is not None else 0))


class TritonKernel:
    """A Triton kernel built from its Python source on first launch, once per mode.

    Built lazily because triton is optional, and per mode because ``triton.jit`` reads TRITON_INTERPRET when it
    wraps a function: a test can switch the interpreter on (monkeypatch.setenv) without leaking it into other
    tests, and the compiled kernel used on a GPU is never an interpreted one.
    """

    def __init__(self, fn):
        self.fn = fn
        self._built: dict[bool, object] = {}

    def __getitem__(self, grid):
        mode = interpreting()
        if mode not in self._built:
            import triton

            self._built[mode] = triton.jit(self.fn)
        return self._built[mode][grid]


def on_device(x: torch.Tensor):
    """Launch on x's GPU (Triton launches on the current device), or do nothing on CPU (the interpreter)."""
    return torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext()


def as_rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` (..., D) as (N, D) with unit stride along D: a view where the layout allows it, else a copy."""
    rows = x.reshape(-1, x.shape[-1])
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def row_tile(width: int, elements: int = 4096) -> tuple[int, int, int]:
    """(rows per program, padded width, warps) for a kernel that reduces whole rows of ``width``.

    Several rows per program when rows are short (q/k heads of 64), so every program moves ~``elements`` values.
    A starting point, not tuned: a GPU benchmark should revisit it.
    """
    block_n = next_power_of_2(width)
    block_m = max(1, min(64, elements // block_n))
    num_warps = min(16, max(4, block_m * block_n // 512))
    return block_m, block_n, num_warps


def persistent_programs(x: torch.Tensor, tiles: int) -> int:
    """How many programs a backward with a parameter gradient launches: each loops over tiles and writes one
    partial sum of that gradient, so the partial sums stay small (a few per streaming multiprocessor)."""
    if x.is_cuda:
        slots = 4 * torch.cuda.get_device_properties(x.device).multi_processor_count
    else:
        slots = 4  # the interpreter: a few programs are enough to exercise the loop
    return max(1, min(tiles, slots))


def promoted(dtype: torch.dtype) -> torch.dtype:
    """At least fp32: the output dtype of the plugins' eager normalisations (statistics and results in fp32)."""
    return torch.promote_types(dtype, torch.float32)
