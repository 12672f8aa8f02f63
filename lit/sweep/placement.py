"""Where a local sweep's runs compute: each worker slot's devices and threads, and what each child's trainer is told.

On CPU a slot is a share of the cores (``cores // parallel`` threads each, as before placement existed). On CUDA a
slot is a set of GPUs, given to its worker as ``CUDA_VISIBLE_DEVICES`` in the fork, before the worker's first CUDA
call, and each child's trainer is told how many it has (``--trainer.accelerator=gpu --trainer.devices=k``):

- one GPU per slot by default;
- ``--gpus_per_run k``: each slot holds k GPUs, its children train on all of them (DDP or FSDP2 in the child);
- ``--runs_per_gpu m``: m slots share each GPU, for runs too small to fill one; before each run a sharing slot waits
  (a while) for its share of the GPU's memory to be free, and the sweep says whether CUDA MPS runs (without it the
  runs sharing a GPU take turns on it);
- ``--parallel auto``: every slot the GPUs hold (GPUs // k x m), or on CPU the cores // threads per run;
- a ladder whose rungs set their own ``gpus_per_run`` (``lit/sweep/ladder.py``): slots of each size side by side on
  disjoint GPUs, and each child runs on a slot of the size its rung asks for (``plan_by_rung``).

This process (the sweep's) never computes with torch and must not create a CUDA context before it forks: the GPUs
are counted through ``CUDA_VISIBLE_DEVICES`` when it is set, else through NVML, never through ``torch.cuda``.
"""

from __future__ import annotations

import math
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lit.errors import UserInputError
from lit.sweep.grid import option_value

GPU_ENV = "CUDA_VISIBLE_DEVICES"
AUTO = "auto"
MEMORY_WAIT_S = 300.0  # how long a slot sharing a GPU waits for its share of memory before it starts anyway
MEMORY_POLL_S = 2.0
GIB = 2**30
DEVICES_KEY = "trainer.devices"  # what a ladder rung with its own gpus_per_run sets in its children's overrides


def parallel_value(text: str) -> int | str:
    """``--parallel``: a number of slots, or ``auto``."""
    if text == AUTO:
        return AUTO
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        import argparse

        raise argparse.ArgumentTypeError(f"--parallel must be a whole number of at least 1 or 'auto', got {text!r}")
    return value


def visible_gpus() -> list[str]:
    """The GPUs a sweep may place runs on, as ``CUDA_VISIBLE_DEVICES`` entries, counted without a CUDA context."""
    listed = os.environ.get(GPU_ENV)
    if listed is not None:
        devices = []
        for entry in (e.strip() for e in listed.split(",")):
            if not entry or entry.startswith("-"):  # CUDA stops reading the list at an invalid entry
                break
            devices.append(entry)
        return devices
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no driver, no NVML: no GPU to place runs on
        return []
    try:
        return [str(i) for i in range(pynvml.nvmlDeviceGetCount())]
    finally:
        pynvml.nvmlShutdown()


def cpu_threads_per_run() -> int:
    """Threads of one CPU run under ``--parallel auto``: ``$OMP_NUM_THREADS`` when set, else 1 (many small runs side
    by side use the cores better than few runs splitting each step between threads)."""
    try:
        return max(1, int(os.environ.get("OMP_NUM_THREADS", "")))
    except ValueError:
        return 1


@dataclass(frozen=True)
class Slot:
    index: int
    devices: tuple[str, ...]  # CUDA_VISIBLE_DEVICES entries; empty on CPU
    threads: int

    def env(self) -> dict[str, str]:
        """What the slot's worker sets in its environment before its first CUDA call."""
        if not self.devices:
            return {}
        env = {GPU_ENV: ",".join(self.devices)}
        if GPU_ENV not in os.environ:  # NVML's indices are PCI bus order; CUDA's must mean the same GPUs
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        return env


@dataclass(frozen=True)
class Layout:
    slots: tuple[Slot, ...]
    gpus_per_run: int  # 0: the runs train on CPU; with slots of several sizes, the size of a run its rung leaves
    runs_per_gpu: int
    gpus: tuple[str, ...] = ()  # every GPU the sweep saw
    # Slots of several sizes (a ladder's rungs on different GPU counts): a child runs only on a slot of the size its
    # arguments ask for (its rung's ``trainer.devices``); with one size every slot takes every child.
    sized_slots: bool = False

    @property
    def parallel(self) -> int:
        return len(self.slots)

    def devices_for(self, child) -> int:
        """The GPUs ``child`` trains on: its rung's ``trainer.devices``, else what every run is told."""
        asked = (getattr(child, "overrides", None) or {}).get(DEVICES_KEY)
        return int(asked) if asked is not None and str(asked).isdigit() else self.gpus_per_run

    def slot_for(self, child, free: list[Slot]) -> Slot | None:
        """The first of the ``free`` slots that can run ``child`` (None: none of them can)."""
        if not self.sized_slots:
            return free[0] if free else None
        return next((s for s in free if len(s.devices) == self.devices_for(child)), None)

    def trainer_args(self, fit_options: list[str]) -> list[str]:
        """What each child's trainer is told, before the sweep's fit options (which win): GPUs and how many."""
        if not self.gpus_per_run:
            return []
        args = []
        if option_value(fit_options, "trainer.accelerator") is None:
            args.append("--trainer.accelerator=gpu")
        if option_value(fit_options, "trainer.devices") is None:
            args.append(f"--trainer.devices={self.gpus_per_run}")
        return args

    def describe(self) -> str:
        if not self.gpus_per_run:
            return f"{self.parallel} slot(s) on CPU, {self.slots[0].threads} thread(s) each"
        share = f", {self.runs_per_gpu} runs per GPU" if self.runs_per_gpu > 1 else ""
        if self.sized_slots:
            counts = Counter(len(s.devices) for s in self.slots)
            per_run = "GPU(s) per run by rung: " + ", ".join(f"{n} slot(s) of {k}" for k, n in
                                                              sorted(counts.items(), reverse=True))
        else:
            per_run = f"{self.gpus_per_run} GPU(s) per run"
        slots = "; ".join(f"slot {s.index}: GPU {','.join(s.devices)}" for s in self.slots)
        idle = len(self.gpus) - len({d for s in self.slots for d in s.devices})
        return (f"{self.parallel} slot(s) on {len(self.gpus)} GPU(s), {per_run}{share} ({slots})"
                + (f"; {idle} GPU(s) left idle" if idle else ""))


def cpu_layout(parallel: int, cpus: int | None = None) -> Layout:
    """``parallel`` slots sharing the cores, as a sweep always split them on CPU."""
    threads = max(1, (cpus or os.cpu_count() or 1) // parallel)
    return Layout(tuple(Slot(i, (), threads) for i in range(parallel)), 0, 1)


def plan(parallel: int | str, gpus_per_run: int | None, runs_per_gpu: int | None, fit_options: list[str],
         gpus: list[str] | None = None, cpus: int | None = None,
         rung_gpus: list[int | None] | None = None) -> Layout:
    """The slots of a local sweep; one ``UserInputError`` line for a layout this machine cannot hold.

    ``rung_gpus``: a ladder's GPUs per run, rung by rung (None: the rung takes the sweep's ``gpus_per_run``)."""
    cpus = cpus or os.cpu_count() or 1
    gpus = visible_gpus() if gpus is None else gpus
    for flag, value in (("--gpus_per_run", gpus_per_run), ("--runs_per_gpu", runs_per_gpu)):
        if value is not None and value < 1:
            raise UserInputError(f"{flag} must be at least 1, got {value}")
    accelerator = (option_value(fit_options, "trainer.accelerator") or "").lower()
    on_cpu = not gpus or accelerator == "cpu"
    if on_cpu:
        for flag, value in (("--gpus_per_run", gpus_per_run), ("--runs_per_gpu", runs_per_gpu)):
            if value is not None:
                where = ("the runs train on CPU (--trainer.accelerator=cpu)" if gpus else
                         f"this machine shows no GPU (NVML and ${GPU_ENV})")
                raise UserInputError(f"{flag} {value}: {where}; drop {flag} to run on CPU")
        for i, value in enumerate(rung_gpus or []):
            if value is not None:
                where = ("the runs train on CPU (--trainer.accelerator=cpu)" if gpus else
                         f"this machine shows no GPU (NVML and ${GPU_ENV})")
                raise UserInputError(f"--ladder rung {i + 1} sets gpus_per_run={value}: {where}; drop gpus_per_run "
                                     "from the rungs to run on CPU")
        slots = max(1, cpus // cpu_threads_per_run()) if parallel == AUTO else parallel
        return cpu_layout(slots, cpus)
    k = gpus_per_run or _devices_asked(fit_options) or 1
    m = runs_per_gpu or 1
    if gpus_per_run is not None and _devices_asked(fit_options) not in (None, gpus_per_run):
        raise UserInputError(f"--trainer.devices={option_value(fit_options, 'trainer.devices')} and --gpus_per_run "
                             f"{gpus_per_run} disagree; pass only --gpus_per_run")
    if k > len(gpus):
        raise UserInputError(f"--gpus_per_run {k}: each run would need {k} GPUs and this machine shows {len(gpus)} "
                             f"({','.join(gpus)}); use --gpus_per_run {len(gpus)} or fewer")
    if k > 1 and m > 1:
        raise UserInputError(f"--runs_per_gpu {m} with --gpus_per_run {k}: runs share a GPU only when each trains on "
                             "one; drop one of them")
    if any(value is not None for value in rung_gpus or []):
        return plan_by_rung(parallel, [value or k for value in rung_gpus], k, m, gpus, cpus)
    groups = len(gpus) // k
    most = groups * m
    slots = most if parallel == AUTO else parallel
    if slots > most:
        per = f"{k} GPUs per run" if k > 1 else "one GPU per run" + (f", {m} runs per GPU" if m > 1 else "")
        raise UserInputError(f"--parallel {slots}: {len(gpus)} GPU(s) at {per} hold {most} run(s) at once; use "
                             f"--parallel auto ({most})" + ("" if k > 1 else ", or share GPUs with --runs_per_gpu M"))
    threads = max(1, cpus // slots)
    # Slot i on GPU group i mod groups: fewer slots than the GPUs hold spread over the GPUs before any shares one.
    return Layout(tuple(Slot(i, tuple(gpus[(i % groups) * k:(i % groups + 1) * k]), threads) for i in range(slots)),
                  k, m, tuple(gpus))


def plan_by_rung(parallel: int | str, sizes: list[int], gpus_per_run: int, runs_per_gpu: int, gpus: list[str],
                 cpus: int) -> Layout:
    """Slots of several sizes on disjoint GPUs, for a ladder whose rungs train on different GPU counts (``sizes``:
    each rung's). Every size gets one slot, so each rung can run from the start (the top rung, the longest, runs
    beside the small ones); then slot by slot, the size with the most rungs per slot gets the next one (ties: the
    larger size), while the GPUs hold it: the sizes' queues then end at about the same time. One-GPU slots share
    their GPUs ``runs_per_gpu`` to a GPU, spread over the GPUs the larger slots leave before any GPU is shared."""
    rungs = Counter(sizes)
    for i, k in enumerate(sizes):
        if k > len(gpus):
            raise UserInputError(f"--ladder rung {i + 1} asks for gpus_per_run={k} and this machine shows "
                                 f"{len(gpus)} GPU(s) ({','.join(gpus)}); give it gpus_per_run={len(gpus)} or fewer")
    if runs_per_gpu > 1 and 1 not in rungs:
        raise UserInputError(f"--runs_per_gpu {runs_per_gpu}: no rung of this ladder trains on one GPU, and only "
                             "one-GPU runs share a GPU; drop --runs_per_gpu")
    slots = dict.fromkeys(sorted(rungs, reverse=True), 1)

    def gpus_used(counts: dict[int, int]) -> int:
        return sum(k * n for k, n in counts.items() if k > 1) + math.ceil(counts.get(1, 0) / runs_per_gpu)

    described = " and ".join(str(k) for k in slots)
    if gpus_used(slots) > len(gpus):
        raise UserInputError(f"--ladder: its rungs train on {described} GPU(s); one run of each at once needs "
                             f"{gpus_used(slots)} GPUs and this machine shows {len(gpus)}; give the rungs fewer "
                             f"different gpus_per_run (e.g. gpus_per_run={max(slots)} on every rung)")
    if parallel != AUTO and parallel < len(slots):
        raise UserInputError(f"--parallel {parallel}: the ladder's rungs train on {described} GPU(s), one slot for "
                             f"each size at least; use --parallel {len(slots)} or more, or --parallel auto")
    while parallel == AUTO or sum(slots.values()) < parallel:
        fits = [k for k in slots if gpus_used({**slots, k: slots[k] + 1}) <= len(gpus)]
        if not fits:
            break
        grow = max(fits, key=lambda k: (rungs[k] / slots[k], k))
        slots[grow] += 1
    if parallel != AUTO and sum(slots.values()) < parallel:
        raise UserInputError(f"--parallel {parallel}: {len(gpus)} GPU(s) hold {sum(slots.values())} run(s) at once "
                             f"of this ladder's sizes ({described} GPUs); use --parallel auto "
                             f"({sum(slots.values())})")
    threads = max(1, cpus // sum(slots.values()))
    placed, start = [], 0
    for k, n in slots.items():  # the larger slots first, each on its own GPUs
        if k == 1:
            continue
        for _ in range(n):
            placed.append(tuple(gpus[start:start + k]))
            start += k
    rest = gpus[start:]
    placed += [(rest[j % len(rest)],) for j in range(slots.get(1, 0))]
    # What every child is told before its rung's own count: the sweep's, which the rungs without their own take.
    default = gpus_per_run if gpus_per_run in rungs else max(rungs)
    return Layout(tuple(Slot(i, devices, threads) for i, devices in enumerate(placed)), default, runs_per_gpu,
                  tuple(gpus), sized_slots=len(slots) > 1)


def _devices_asked(fit_options: list[str]) -> int | None:
    """The GPUs per run the sweep's fit options ask for (``--trainer.devices=k``), if a count."""
    value = option_value(fit_options, "trainer.devices")
    if value is None:
        return None
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise UserInputError(f"--trainer.devices={value}: a sweep gives each run its GPUs; say how many with "
                             "--gpus_per_run K instead")
    return count


def mps_state() -> str:
    """One line: whether CUDA MPS runs here (the runs sharing a GPU then run side by side, not in turns)."""
    pipe = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"))
    daemon = any(_process_name(p).startswith("nvidia-cuda-mps") for p in Path("/proc").glob("[0-9]*"))
    if daemon or (pipe / "control").exists():
        return f"CUDA MPS: running (pipe directory {pipe}); the runs sharing a GPU run side by side"
    return ("CUDA MPS: not running; the runs sharing a GPU take turns on it (start MPS with "
            "`nvidia-cuda-mps-control -d` to run them side by side)")


def _process_name(proc: Path) -> str:
    try:
        return (proc / "comm").read_text().strip()
    except OSError:
        return ""


def free_memory(device: str) -> tuple[int, int]:
    """(free, total) bytes of one GPU, by ``CUDA_VISIBLE_DEVICES`` entry (an index or a UUID), through NVML."""
    import pynvml

    pynvml.nvmlInit()
    try:
        handle = (pynvml.nvmlDeviceGetHandleByUUID(device) if not device.isdigit()
                  else pynvml.nvmlDeviceGetHandleByIndex(int(device)))
        info = pynvml.nvmlDeviceGetMemoryInfo(handle)
        return int(info.free), int(info.total)
    finally:
        pynvml.nvmlShutdown()


def wait_for_share(device: str, runs_per_gpu: int, say: Callable[[str], None],
                   read: Callable[[str], tuple[int, int]] = free_memory, wait_s: float = MEMORY_WAIT_S,
                   poll_s: float = MEMORY_POLL_S, sleep: Callable[[float], None] = time.sleep) -> bool:
    """Before a run on a shared GPU: wait until its share (total / runs_per_gpu) of the GPU's memory is free, at
    most ``wait_s``; says what it found either way. True when the share was free."""
    waited = 0.0
    while True:
        free, total = read(device)
        share = total // runs_per_gpu
        if free >= share:
            say(f"GPU {device}: {free / GIB:.1f} GiB free of {total / GIB:.1f}; this run's share is "
                f"{share / GIB:.1f} GiB ({runs_per_gpu} runs per GPU)")
            return True
        if waited >= wait_s:
            say(f"GPU {device}: {free / GIB:.1f} GiB free of {total / GIB:.1f} after {waited:.0f} s, less than this "
                f"run's share {share / GIB:.1f} GiB; starting anyway (it may run out of memory: lower --runs_per_gpu)")
            return False
        sleep(poll_s)
        waited += poll_s
