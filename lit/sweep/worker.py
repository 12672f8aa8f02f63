"""A long-lived sweep worker: one process per ``--parallel`` slot that runs children one after another.

Forked from the sweep process (which has imported torch, Lightning and MLflow but never computed with
torch), a worker pays once what a process per run paid every time: the process start, the first use of
Lightning's and jsonargparse's lazy machinery, the CLI parser, the first MLflow store connection, and on a
GPU the CUDA context. Each run is still on its own:

- its output goes to its own log (the worker points its stdout and stderr there for the run);
- what a run may change in the process is put back before the next one: environment variables, the working
  directory, signal handlers, torch's thread count and matmul precision, default dtype, compiled graphs, an
  MLflow run left active (``reset_between_runs``); every run seeds its own random generators as a fresh
  process does;
- a run that ends any other way than an outcome (a crash, a user error, an interrupt) ends its worker after
  the worker reports it, and the pool forks a fresh one for the next run, so no half-torn-down state is ever
  inherited. A run that kills its process (a segfault, SIGKILL) costs only itself too: the pool sees the
  worker's end as that run's exit status, exactly what a process per run reported.

The protocol is one line per message over two pipes: the pool writes the index of a child, the worker
answers its exit code. End of file on the task pipe tells a worker to exit.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from lit.sweep.child import ALL_DIVERGED_EXIT, DIVERGED_EXIT, OWNED_ELSEWHERE_EXIT

# Exit codes after which a worker takes the next run: the run ended with an outcome and tore itself down.
# Any other code (1 a crash, 2 a user error, 130 an interrupt) ends the worker after it is reported.
KEEPS_WORKER = frozenset({0, DIVERGED_EXIT, ALL_DIVERGED_EXIT, OWNED_ELSEWHERE_EXIT})
# The signals that stop a sweep (lit/sweep/command.py) and that it forwards to its workers.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass
class Worker:
    pid: int
    tasks: int  # write end: child indices
    results: object  # read end, a binary file: exit codes
    current: tuple | None = None  # (child, started, log) while a run is in flight
    runs: int = 0
    buffer: bytes = field(default=b"")
    slot: int = 0  # the placement slot it serves (lit/sweep/placement.py): a fresh worker of a slot gets its devices


def start_worker(run: Callable[[int], int], log_for: Callable[[int], Path], threads: int,
                 env: dict[str, str] | None = None, before_run: Callable[[], None] | None = None,
                 slot: int = 0) -> Worker:
    """Fork a worker that runs ``run(index)`` for each index the pool sends, its output in ``log_for(index)``.

    ``env`` is set in the worker before anything else (its slot's ``CUDA_VISIBLE_DEVICES``: before its first CUDA
    call); ``before_run()`` runs before each run, its output in that run's log.
    """
    task_r, task_w = os.pipe()
    result_r, result_w = os.pipe()
    # The stop signals are held from before the fork until each process has its own handlers. Else a SIGTERM that
    # the sweep forwards to a worker it has just forked (a sweep stopped at that moment) reaches the worker while
    # it still has the sweep's handler: raised inside the fork's own bookkeeping, the exception is dropped, the
    # worker lives on, and the sweep waits for it forever. Held, the signal waits and then kills the worker.
    held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    pid = os.fork()
    if pid:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        os.close(task_r)
        os.close(result_w)
        return Worker(pid, task_w, os.fdopen(result_r, "rb", buffering=0), slot=slot)
    _worker_signal_handlers()
    signal.pthread_sigmask(signal.SIG_SETMASK, held)
    code = 1
    try:
        os.environ.update(env or {})
        os.close(task_w)
        os.close(result_r)
        _serve(run, log_for, threads, os.fdopen(task_r, "rb"), result_w, before_run)
        code = 0
    except BaseException:  # the worker itself failed: the pool reports the run it was given, if any
        traceback.print_exc()
    finally:
        os._exit(code)


def send(worker: Worker, index: int, child, log: Path) -> None:
    os.write(worker.tasks, f"{index}\n".encode())
    worker.current = (child, time.monotonic(), log)


def stop(worker: Worker) -> None:
    """Tell an idle worker to exit (end of file on its task pipe)."""
    try:
        os.close(worker.tasks)
    except OSError:
        pass


def _serve(run: Callable[[int], int], log_for: Callable[[int], Path], threads: int, tasks, results_fd: int,
           before_run: Callable[[], None] | None = None) -> None:
    from lit.cli import reuse_parsers

    _become_worker(threads)
    reuse_parsers()
    baseline = ProcessState.capture()
    for line in tasks:
        index = int(line)
        _point_output_to(log_for(index))
        if before_run is not None:
            before_run()
        code = _run_one(run, index)
        baseline.restore()
        reset_between_runs()
        sys.stdout.flush()
        sys.stderr.flush()
        os.write(results_fd, f"{code}\n".encode())
        if code not in KEEPS_WORKER:
            return


def _run_one(run: Callable[[int], int], index: int) -> int:
    try:
        return run(index)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except KeyboardInterrupt:
        traceback.print_exc()
        return 130
    except BaseException:
        traceback.print_exc()
        return 1
    finally:
        mlflow = sys.modules.get("mlflow")  # a run that never imported it has nothing queued
        try:
            if mlflow is not None:
                mlflow.flush_async_logging()
        except Exception:  # nothing queued, or the store is gone: the exit code says what happened
            pass


def _become_worker(threads: int) -> None:
    """Fresh DB connections and this worker's share of the cores (the parent's connections stay the parent's)."""
    store = sys.modules.get("mlflow.store.tracking.sqlalchemy_store")  # None: no connection to inherit
    for engine in list(store.SqlAlchemyStore._engine_map.values()) if store is not None else []:
        engine.dispose(close=False)  # SQLAlchemy's rule for a forked process
    import torch

    torch.set_num_threads(threads)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    # What the sweep imported lives as long as the worker: out of the collector's way, the collection between
    # runs (which frees the last run's model) scans only what runs created.
    gc.freeze()


def _worker_signal_handlers() -> None:
    """A run's defaults in place of the sweep's own handlers: Ctrl-C raises KeyboardInterrupt, SIGTERM and SIGHUP
    end the process (a run's preemption handler, if it has one, replaces them while it trains)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def _point_output_to(log_path: Path) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


@dataclass
class ProcessState:
    """What a run may change in its process and the next run must not inherit."""

    environ: dict
    cwd: str
    handlers: dict
    threads: int
    matmul_precision: str
    default_dtype: object
    deterministic: tuple

    @classmethod
    def capture(cls) -> ProcessState:
        import torch

        return cls(dict(os.environ), os.getcwd(),
                   {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP,
                                                           signal.SIGUSR1)},
                   torch.get_num_threads(), torch.get_float32_matmul_precision(), torch.get_default_dtype(),
                   (torch.are_deterministic_algorithms_enabled(),
                    torch.is_deterministic_algorithms_warn_only_enabled()))

    def restore(self) -> None:
        import torch

        os.environ.clear()
        os.environ.update(self.environ)
        os.chdir(self.cwd)
        for sig, handler in self.handlers.items():
            if handler is not None:
                signal.signal(sig, handler)
        torch.set_num_threads(self.threads)
        torch.set_float32_matmul_precision(self.matmul_precision)
        torch.set_default_dtype(self.default_dtype)
        torch.use_deterministic_algorithms(self.deterministic[0], warn_only=self.deterministic[1])


def reset_between_runs() -> None:
    """Global state a run leaves in libraries: an MLflow run still active, compiled graphs (dynamo's caches
    would count the next run's model against the recompile limit), the memory of the last run."""
    mlflow = sys.modules.get("mlflow")
    try:
        while mlflow is not None and mlflow.active_run() is not None:
            mlflow.end_run()
    except Exception:  # the store is gone: the next run opens its own connection and says so
        pass
    distributed = sys.modules.get("torch.distributed")  # a run on several devices: its group ended with its ranks
    if distributed is not None and distributed.is_available() and distributed.is_initialized():
        distributed.destroy_process_group()
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        dynamo.reset()
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
