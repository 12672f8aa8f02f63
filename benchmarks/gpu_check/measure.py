"""How every contender is timed: warm-up apart, synchronised windows with CUDA events, interleaved rounds.

The guards of the review's section 9 live here, once, for stages B (raw loop), C and D:

- the first step (compile, cuBLAS heuristics, allocator growth) is timed on its own and never counted, and at least
  ``warmup`` more steps run before any window;
- every window starts and ends with ``torch.cuda.synchronize()``; each step inside it is bracketed by CUDA events,
  so per-step times come from the device's clock;
- contenders run in rounds, the order rotated each round, so clock and thermal drift hit all alike;
- the loss is read (a sync) only outside the windows, and must be finite;
- a contender that runs out of memory is recorded as such and dropped, and the others go on;
- memory: the allocator's peak is reset before each contender's warm-up, and its own peak is what it allocated
  above what was resident before it was built.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import math
import statistics
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

GIB = 1 << 30


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def quantiles(values: list[float]) -> dict[str, float]:
    """Median and 20th/80th percentiles (the spread every table reports)."""
    q = statistics.quantiles(values, n=5, method="inclusive") if len(values) >= 2 else list(values) * 4
    return {"median": statistics.median(values), "p20": q[0], "p80": q[-1]}


def free_memory(device: torch.device) -> None:
    """Collect what cycles still hold and return the allocator's cache (a GPU only: on a CPU, the dry run's tiny
    models, a full collection per contender would cost more than it frees)."""
    if device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()


def is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


def error_text(exc: BaseException) -> str:
    """One line for the report, the traceback's last frames for whoever reads the JSON."""
    frames = traceback.format_exception(type(exc), exc, exc.__traceback__)
    tail = "".join(frames[-12:]).strip()
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}\n{tail}"[:8000]


@contextlib.contextmanager
def compile_backend(backend: str | None) -> Iterator[None]:
    """``torch.compile`` (and ``nn.Module.compile``, which calls it) with ``backend`` unless one is given.

    The dry run compiles with ``aot_eager`` (no C++ or Triton toolchain needed) through the same calls the GPU run
    makes with inductor, including calls inside project code (the compile overlay) and ``benchmarks.kernels``.
    """
    if backend is None:
        yield
        return
    original = torch.compile

    @functools.wraps(original)
    def compile_with_backend(*args, **kwargs):
        kwargs.setdefault("backend", backend)
        return original(*args, **kwargs)

    torch.compile = compile_with_backend
    try:
        yield
    finally:
        torch.compile = original


def dynamo_counts() -> dict[str, int]:
    """Graphs compiled and graph breaks so far in this process (dynamo's counters)."""
    from torch._dynamo.utils import counters

    return {"graphs": int(counters["stats"]["unique_graphs"]),
            "breaks": int(sum(counters["graph_break"].values()))}


@dataclass
class Contender:
    """One thing timed: ``step()`` runs one training step and returns its loss (a device tensor)."""

    name: str
    step: Callable[[], torch.Tensor]
    tokens_per_step: int
    info: dict = field(default_factory=dict)
    step_s: list[float] = field(default_factory=list)  # every timed step, all rounds
    window_s: list[float] = field(default_factory=list)  # per round: mean step time by the host's clock
    status: str = "ran"
    error: str | None = None

    def fail(self, exc: BaseException) -> None:
        self.status = "oom" if is_oom(exc) else "failed"
        self.error = error_text(exc)
        self.step = None  # type: ignore[assignment]  # drops the closure: model and optimizer can be freed

    @property
    def alive(self) -> bool:
        return self.status == "ran"


def check_finite(loss: torch.Tensor, where: str) -> float:
    value = float(loss.detach().float())
    if not math.isfinite(value):
        raise FloatingPointError(f"non-finite loss {value} {where}")
    return value


def warm_up(c: Contender, device: torch.device, warmup: int, resident_before: int) -> None:
    """First step timed alone (compile); then ``warmup`` steps, each synchronised, giving host and device time.

    Host-bound: the host takes at least as long to issue a step as the device takes to run it (each warm-up step
    starts on an idle device, so issuing is not slowed by a full queue).
    """
    try:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        sync(device)
        t0 = time.perf_counter()
        loss = c.step()
        sync(device)
        c.info["first_step_s"] = time.perf_counter() - t0
        c.info["loss_step0"] = check_finite(loss, "at the first step")
        host, dev = [], []
        for _ in range(warmup):
            if device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                sync(device)
                start.record()
                t0 = time.perf_counter()
                loss = c.step()
                host.append(time.perf_counter() - t0)
                end.record()
                sync(device)
                dev.append(start.elapsed_time(end) / 1e3)
            else:  # the CPU is the device: issuing a step is running it, so both times are its wall time
                t0 = time.perf_counter()
                loss = c.step()
                host.append(time.perf_counter() - t0)
                dev.append(host[-1])
        c.info["loss_after_warmup"] = check_finite(loss, "after warm-up")
        if host:
            c.info["host_issue_s"] = statistics.median(host)
            c.info["device_step_s"] = statistics.median(dev)
            # On a CPU the question has no answer (host and device are one), so it is left open.
            c.info["host_bound"] = (c.info["host_issue_s"] >= 0.9 * c.info["device_step_s"]
                                    if device.type == "cuda" else None)
        if device.type == "cuda":
            c.info["peak_allocated_gib"] = (torch.cuda.max_memory_allocated(device) - resident_before) / GIB
            c.info["peak_reserved_gib"] = torch.cuda.max_memory_reserved(device) / GIB
    except Exception as exc:
        c.fail(exc)
        free_memory(device)


def window(c: Contender, device: torch.device, steps: int) -> None:
    """``steps`` timed steps: per-step times from CUDA events (perf_counter on CPU), synchronised at both ends."""
    try:
        sync(device)
        t0 = time.perf_counter()
        if device.type == "cuda":
            events = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
            events[0].record()
            for i in range(steps):
                c.step()
                events[i + 1].record()
            sync(device)
            c.step_s += [a.elapsed_time(b) / 1e3 for a, b in zip(events, events[1:], strict=False)]
        else:
            for _ in range(steps):
                t = time.perf_counter()
                c.step()
                c.step_s.append(time.perf_counter() - t)
        c.window_s.append((time.perf_counter() - t0) / steps)
    except Exception as exc:
        c.fail(exc)
        free_memory(device)


def interleaved_rounds(contenders: list[Contender], device: torch.device, rounds: int, steps: int,
                       fits: Callable[[float], bool] | None = None) -> int:
    """``rounds`` rounds of a window per live contender, order rotated per round; returns the rounds run.

    A round starts only if ``fits`` (the stage clock) says the next round, at the last round's cost, fits.
    """
    done, last_round_s = 0, 0.0
    for r in range(rounds):
        live = [c for c in contenders if c.alive]
        if not live or (fits is not None and done > 0 and not fits(last_round_s)):
            break
        t0 = time.perf_counter()
        first = r % len(live)
        for c in live[first:] + live[:first]:
            window(c, device, steps)
        last_round_s, done = time.perf_counter() - t0, done + 1
    for c in contenders:
        if c.alive:
            try:
                c.info["loss_after_rounds"] = check_finite(c.step(), "after the timed rounds")
            except Exception as exc:
                c.fail(exc)
    return done


def summary(c: Contender, flops_per_token: float | None, peaks: dict[str, float | None]) -> dict:
    """The contender's row: step time (median, p20-p80), tokens/s, MFU against each peak, memory, the rest."""
    row = {"status": c.status, **c.info}
    if c.error:
        row["error"] = c.error
    if not c.step_s:
        return row
    q = quantiles(c.step_s)
    row.update(step_s=q, steps_timed=len(c.step_s), rounds=len(c.window_s),
               tokens_per_s=c.tokens_per_step / q["median"],
               window_tokens_per_s=c.tokens_per_step / statistics.median(c.window_s))
    if flops_per_token:
        row["flops_per_token"] = flops_per_token
        for key, peak in peaks.items():
            row[f"mfu_{key}"] = flops_per_token * row["tokens_per_s"] / peak if peak else None
    return row
