"""Runs a sweep's children on this machine, ``parallel`` at a time, in long-lived workers forked from this one.

Forking a process that has already imported torch, Lightning and MLflow starts a worker in milliseconds; a
fresh interpreter per run would spend seconds importing them. A worker (``lit/sweep/worker.py``) then runs
children one after another, so what every run paid once more in a process of its own (Lightning's and
jsonargparse's first-use work, the first MLflow connection, a CUDA context) is paid once per slot. Runs stay
apart: each has its log, what a run changes in the process is put back, and a run that ends in anything but
an outcome (a crash, an interrupt, a killed process) ends its worker; the next run gets a fresh fork.

What makes the fork safe: this process never computes with torch (it only tracks and forks), so no
OpenMP thread pool exists to be copied half-alive; and each worker drops the database connections it
inherited from MLflow's engine pool (``dispose(close=False)``, SQLAlchemy's rule for forked processes)
before it opens its own.
"""

from __future__ import annotations

import os
import select
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lit.sweep.child import ALL_DIVERGED_EXIT, DIVERGED_EXIT, OWNED_ELSEWHERE_EXIT
from lit.sweep.grid import Child
from lit.sweep.placement import Layout, cpu_layout, wait_for_share
from lit.sweep.worker import KEEPS_WORKER, Worker, send, start_worker
from lit.sweep.worker import stop as stop_worker

POLL_S = 0.2  # how often the sweep looks for ended children (and beats)
ENDED = {0: "done", DIVERGED_EXIT: "diverged", ALL_DIVERGED_EXIT: "not run (every tuning value diverged)",
         OWNED_ELSEWHERE_EXIT: "left to its other owner"}


@dataclass
class Outcome:
    child: Child
    code: int  # 0 done, 2 user error, other: see lit/sweep/child.py; -1 not started (its tuning failed)
    seconds: float
    log: Path | None


def run_children(children: list[Child], run: Callable[[Child], int], parallel: int | Layout, log_dir: Path,
                 gate: Callable[[Child], str], report: Callable[[str], None],
                 results: dict[str, int], tick: Callable[[], None] | None = None) -> list[Outcome]:
    """Run ``children`` in order, ``parallel`` at a time, in at most ``parallel`` workers.

    ``parallel`` is a placement (``lit/sweep/placement.py``: each slot's devices and threads), or a number of slots
    sharing the cores. A worker serves one slot; the fresh worker that replaces it gets the same slot.

    Each child's exit code is recorded in ``results`` (by key) as it ends. ``gate(child)`` says whether a
    child may start: "ready", "wait" (something it needs is still running) or "blocked" (something it
    needs failed). A child whose run exits 2 (a user error, such as a value the recipe rejects) stops the
    sweep from starting others: the rest would fail the same way. ``tick()`` is called about every
    ``POLL_S`` seconds while children run (the sweep's heartbeat).
    """
    layout = cpu_layout(parallel) if isinstance(parallel, int) else parallel
    logs = {i: log_dir / (c.key.replace("|", "__").replace("/", "_").replace("=", "-") + ".log")
            for i, c in enumerate(children)}
    index_of = {id(c): i for i, c in enumerate(children)}
    pending, workers, outcomes = list(children), [], []
    stop = False

    def start_next(worker: Worker | None) -> bool:
        """Give the next ready child to ``worker`` (a new one when None); False when none can start now."""
        while True:  # a child goes to a slot that can run it (a ladder's rungs may ask for slots of other sizes)
            free = ([layout.slots[worker.slot]] if worker is not None
                    else [s for s in layout.slots if s.index not in {w.slot for w in workers}])
            ready = next((c for c in pending if gate(c) != "wait" and layout.slot_for(c, free)), None)
            if ready is None:
                return False
            pending.remove(ready)
            if gate(ready) == "blocked":
                outcomes.append(Outcome(ready, -1, 0.0, None))
                results[ready.key] = -1
                report(f"skip {ready.key}: the runs it waits for did not all finish")
                continue
            if worker is None:
                slot = layout.slot_for(ready, free)
                worker = start_worker(lambda i: run(children[i]), logs.__getitem__, slot.threads, slot.env(),
                                      _share_check(layout, slot), slot.index)
                workers.append(worker)
            index = index_of[id(ready)]
            send(worker, index, ready, logs[index])
            report(f"start {ready.key} (log: {logs[index]})")
            return True

    def ended(worker: Worker, code: int) -> None:
        nonlocal stop
        child, started, log = worker.current
        worker.current = None
        outcomes.append(Outcome(child, code, time.monotonic() - started, log))
        results[child.key] = code
        report(f"{ENDED.get(code, f'FAILED (exit {code})')} {child.key} in {time.monotonic() - started:.1f} s")
        if code == 2:
            stop = True

    try:
        while True:
            if not stop:
                for worker in [w for w in workers if w.current is None]:
                    start_next(worker)
                while len(workers) < layout.parallel and start_next(None):
                    pass
            busy = [w for w in workers if w.current is not None]
            if not busy:
                if stop or not pending:
                    break
                raise RuntimeError(f"no child can start: {[c.key for c in pending]}")  # a bug in the gate
            readable, _, _ = select.select([w.results for w in workers], [], [], POLL_S)
            if tick is not None:
                tick()
            for worker in [w for w in workers if w.results in readable]:
                answer = worker.results.read(64)
                code = int(answer.strip().splitlines()[-1]) if answer else None
                if code is not None:  # one code per run: the worker answers once its run has ended
                    worker.runs += 1
                    ended(worker, code)
                    if code in KEEPS_WORKER:
                        continue
                # The worker ends: after a run that did not keep it (reported above), or killed within a run
                # (its exit status is that run's code, as a process per run reported it).
                _, status = os.waitpid(worker.pid, 0)
                workers.remove(worker)
                worker.results.close()
                stop_worker(worker)
                if worker.current is not None:
                    ended(worker, os.waitstatus_to_exitcode(status))
    except KeyboardInterrupt:
        for worker in workers:
            try:
                os.kill(worker.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for worker in workers:
            os.waitpid(worker.pid, 0)
        raise
    for worker in workers:  # idle: end of file on their task pipes, and they exit
        stop_worker(worker)
    for worker in workers:
        os.waitpid(worker.pid, 0)
    return outcomes


def _share_check(layout: Layout, slot) -> Callable[[], None] | None:
    """What a slot sharing its GPU does before each run (in its worker): wait for its share of the GPU's memory."""
    if layout.runs_per_gpu < 2 or len(slot.devices) != 1:
        return None
    return lambda: wait_for_share(slot.devices[0], layout.runs_per_gpu, lambda line: print(line, flush=True))
