"""Runs a sweep's children on this machine, ``parallel`` at a time, each in a process forked from this one.

Forking a process that has already imported torch, Lightning and MLflow starts a child in milliseconds;
a fresh interpreter per run would spend seconds importing them (``cli.py plugins``' 8 s on 2 cores is
mostly that), more than 10% of a short run. Each fork is still a process of its own, so no state of one
run leaks into the next (random generators, MLflow's active run, torch's thread count).

What makes the fork safe: this process never computes with torch (it only tracks and forks), so no
OpenMP thread pool exists to be copied half-alive; and each child drops the database connections it
inherited from MLflow's engine pool (``dispose(close=False)``, SQLAlchemy's rule for forked processes)
before it opens its own.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lit.sweep.child import ALL_DIVERGED_EXIT, DIVERGED_EXIT, OWNED_ELSEWHERE_EXIT
from lit.sweep.grid import Child

POLL_S = 0.2  # how often the sweep looks for ended children (and beats)
ENDED = {0: "done", DIVERGED_EXIT: "diverged", ALL_DIVERGED_EXIT: "not run (every tuning value diverged)",
         OWNED_ELSEWHERE_EXIT: "left to its other owner"}


@dataclass
class Outcome:
    child: Child
    code: int  # 0 done, 2 user error, other: see lit/sweep/child.py; -1 not started (its tuning failed)
    seconds: float
    log: Path | None


def after_fork(threads: int, log_path: Path) -> None:
    """Make a forked child a clean process of its own: fresh DB connections, its share of the cores, its log."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    for engine in list(SqlAlchemyStore._engine_map.values()):
        engine.dispose(close=False)  # the parent's connections stay the parent's
    import torch

    torch.set_num_threads(threads)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGHUP):  # the sweep's own handlers are not the run's
        signal.signal(sig, signal.SIG_DFL)


def _fork(run: Callable[[], int], threads: int, log_path: Path) -> int:
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        after_fork(threads, log_path)
        code = run()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            import mlflow

            mlflow.flush_async_logging()
        except Exception:  # nothing queued, or the store is gone: the exit code says what happened
            pass
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def run_children(children: list[Child], run: Callable[[Child], int], parallel: int, log_dir: Path,
                 gate: Callable[[Child], str], report: Callable[[str], None],
                 results: dict[str, int], tick: Callable[[], None] | None = None) -> list[Outcome]:
    """Run ``children`` in order, ``parallel`` at a time, each in a forked process.

    Each child's exit code is recorded in ``results`` (by key) as it ends. ``gate(child)`` says whether a
    child may start: "ready", "wait" (something it needs is still running) or "blocked" (something it
    needs failed). A child whose run exits 2 (a user error, such as a value the recipe rejects) stops the
    sweep from starting others: the rest would fail the same way. ``tick()`` is called about every
    ``POLL_S`` seconds while children run (the sweep's heartbeat).
    """
    threads = max(1, (os.cpu_count() or 1) // parallel)
    pending, running, outcomes = list(children), {}, []
    stop = False
    try:
        while pending or running:
            while not stop and len(running) < parallel:
                ready = next((c for c in pending if gate(c) != "wait"), None)
                if ready is None:
                    break
                pending.remove(ready)
                if gate(ready) == "blocked":
                    outcomes.append(Outcome(ready, -1, 0.0, None))
                    results[ready.key] = -1
                    report(f"skip {ready.key}: the runs it waits for did not all finish")
                    continue
                log = log_dir / (ready.key.replace("|", "__").replace("/", "_").replace("=", "-") + ".log")
                pid = _fork(lambda c=ready: run(c), threads, log)
                running[pid] = (ready, time.monotonic(), log)
                report(f"start {ready.key} (log: {log})")
            if not running:
                if stop or not pending:
                    break
                raise RuntimeError(f"no child can start: {[c.key for c in pending]}")  # a bug in the gate
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                if tick is not None:
                    tick()
                time.sleep(POLL_S)
                continue
            if pid not in running:
                continue
            child, started, log = running.pop(pid)
            code = os.waitstatus_to_exitcode(status)
            outcomes.append(Outcome(child, code, time.monotonic() - started, log))
            results[child.key] = code
            report(f"{ENDED.get(code, f'FAILED (exit {code})')} {child.key} "
                   f"in {time.monotonic() - started:.0f} s")
            if code == 2:
                stop = True
    except KeyboardInterrupt:
        for pid in running:
            os.kill(pid, signal.SIGTERM)
        for pid in list(running):
            os.waitpid(pid, 0)
        raise
    return outcomes
