"""The local sweep's workers (lit/sweep/local.py, lit/sweep/worker.py): a slot's worker runs children one after
another in one process, what a run changes in the process is put back, and a run that crashes or kills its
process costs only itself while the next child of the same slot runs (in a fresh worker).

The fast tests drive ``run_children`` with runs that train nothing (they say which process ran them); the slow
one runs a real sweep in which one seed's process is killed, and checks what the store records.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import lit.cli  # noqa: F401  (warm, as the sweep is when it forks its workers: they import nothing then)
from lit.sweep.grid import Child
from lit.sweep.local import run_children
from tests.conftest import REPO, subprocess_env


def children(*behaviours: str) -> list[Child]:
    return [Child(f"{b}|{i}", "v", "seed", 1000 + i, i, {}) for i, b in enumerate(behaviours)]


def fake_run(record: Path):
    """A run that records its process and what it saw, then behaves as its key says."""

    def run(child: Child) -> int:
        behaviour = child.key.split("|")[0]
        leaked = os.environ.get("LEFT_BY_AN_EARLIER_RUN", "-")
        with open(record, "a") as f:
            f.write(f"{child.key} {os.getpid()} {leaked} {signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL}\n")
        os.environ["LEFT_BY_AN_EARLIER_RUN"] = child.key  # state a run leaves behind
        signal.signal(signal.SIGUSR1, lambda *_: None)
        print(f"output of {child.key}")
        if behaviour == "raise":
            raise RuntimeError("a bug in this run")
        if behaviour == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if behaviour == "exit":
            sys.exit(7)
        return {"ok": 0, "diverged": 3}[behaviour]

    return run


def ran(record: Path) -> list[tuple[str, int, str, bool]]:
    rows = [line.split() for line in record.read_text().splitlines()]
    return [(key, int(pid), leaked, clean == "True") for key, pid, leaked, clean in rows]


def test_one_worker_runs_its_children_in_turn_and_a_crash_costs_only_its_run(tmp_path):
    record, reports = tmp_path / "ran.txt", []
    todo = children("ok", "ok", "diverged", "raise", "ok", "kill", "ok", "exit", "ok")
    results: dict[str, int] = {}
    outcomes = run_children(todo, fake_run(record), 1, tmp_path / "logs", lambda c: "ready", reports.append,
                            results)
    assert [o.code for o in outcomes] == [0, 0, 3, 1, 0, -signal.SIGKILL, 0, 7, 0]
    assert results == {c.key: o.code for c, o in zip(todo, outcomes, strict=True)}
    rows = ran(record)
    assert [r[0] for r in rows] == [c.key for c in todo]  # every child ran, in order, after each crash too
    pids = [r[1] for r in rows]
    # One process for the runs that ended with an outcome; a crash (raised, killed, exited) ends its worker,
    # and the next run gets a fresh one forked from the sweep.
    assert pids[0] == pids[1] == pids[2] == pids[3] != os.getpid()
    assert pids[4] == pids[5] != pids[3]
    assert pids[6] == pids[7] != pids[5]
    assert pids[8] != pids[7]
    # Nothing a run changed reaches the next one in the same worker: environment and signal handlers put back.
    assert all(leaked == "-" and clean for _, _, leaked, clean in rows), rows
    # Each run's output is in its own log, the crash's traceback in the crashed run's.
    log = {c.key: o.log.read_text() for c, o in zip(todo, outcomes, strict=True)}
    assert all(f"output of {k}" in text and text.count("output of") == 1 for k, text in log.items())
    assert "RuntimeError: a bug in this run" in log["raise|3"]
    assert any(r.startswith("FAILED (exit -9) kill|5") for r in reports), reports


def test_each_slot_has_one_worker_and_a_user_error_stops_new_starts(tmp_path):
    record = tmp_path / "ran.txt"
    outcomes = run_children(children("ok", "ok", "ok", "ok"), fake_run(record), 2, tmp_path / "logs",
                            lambda c: "ready", lambda msg: None, {})
    assert sorted(o.code for o in outcomes) == [0, 0, 0, 0]
    pids = [pid for _, pid, _, _ in ran(record)]
    assert len(set(pids)) == 2 and os.getpid() not in pids  # one worker per slot; a free slot takes the next run

    def user_error(child: Child) -> int:
        return 2 if child.seed_index == 0 else 0

    outcomes = run_children(children("a", "b", "c"), user_error, 1, tmp_path / "logs2", lambda c: "ready",
                            lambda msg: None, {})
    assert [o.code for o in outcomes] == [2]  # the rest would fail the same way


def test_a_child_waits_for_what_it_needs_and_is_skipped_when_that_failed(tmp_path):
    todo = children("ok", "kill", "ok", "ok")
    results: dict[str, int] = {}

    def gate(child: Child) -> str:  # child 2 needs child 0, child 3 needs child 1
        need = {2: todo[0].key, 3: todo[1].key}.get(child.seed_index)
        if need is None:
            return "ready"
        code = results.get(need)
        return "wait" if code is None else ("ready" if code == 0 else "blocked")

    outcomes = run_children(todo, fake_run(tmp_path / "ran.txt"), 2, tmp_path / "logs", gate, lambda m: None,
                            results)
    assert results == {todo[0].key: 0, todo[1].key: -signal.SIGKILL, todo[2].key: 0, todo[3].key: -1}
    assert len(outcomes) == 4


@pytest.mark.slow
def test_a_sweep_whose_run_is_killed_records_it_and_runs_the_next_seed_in_that_slot(tmp_path):
    from mlflow import MlflowClient

    from lit.sweep import protocol as P

    tiny = ["--model.arch.d_model=32", "--model.arch.n_layers=2", "--model.arch.n_heads=2", "--data.block_size=16",
            "--data.batch_size=4", "--trainer.max_steps=3", "--trainer.val_check_interval=3",
            "--trainer.limit_val_batches=2", "--trainer.limit_test_batches=2"]
    args = [sys.executable, str(REPO / "cli.py"), "sweep", "--config", str(REPO / "recipes" / "gpt_baseline.yaml"),
            "--seeds", "3", "--experiment", "crash", *tiny,
            "--trainer.callbacks+={class_path: tests.crash_on_seed.SigkillOnSeed, init_args: {seed: 1338}}"]
    out = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, env=subprocess_env(), timeout=900)
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-2000:]
    assert "FAILED (exit -9) recipe|seed|1338" in out.stdout and "done recipe|seed|1339" in out.stdout
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("crash").experiment_id])
    status = {r.data.tags.get(P.CHILD_KEY): r.info.status for r in runs if r.data.tags.get(P.ROLE) == P.CHILD}
    # The killed run is not left RUNNING (its owner is gone) and is run again by the next sweep; the others count.
    assert status == {"recipe|seed|1337": "FINISHED", "recipe|seed|1338": "KILLED", "recipe|seed|1339": "FINISHED"}
    tested = [r for r in runs if "test/loss" in r.data.metrics]
    assert len(tested) == 2


def test_a_stop_signal_sent_to_a_worker_just_forked_ends_it(tmp_path):
    """A sweep stopped just after it forked a worker forwards SIGTERM to it before the worker has its own handlers.
    The worker must die of it: under the sweep's handler it would raise inside the fork's bookkeeping, where the
    exception is dropped, and live on while the sweep waits for it (seen: a stopped sweep that never ended)."""
    from lit.sweep.worker import start_worker
    from lit.sweep.worker import stop as stop_worker

    def sweeps_handler(signum, frame):
        raise RuntimeError("the sweep's handler ran in its worker")

    previous, outcomes = signal.signal(signal.SIGTERM, sweeps_handler), []
    try:
        for _ in range(20):
            worker = start_worker(lambda index: 0, lambda index: tmp_path / f"{index}.log", threads=1)
            os.kill(worker.pid, signal.SIGTERM)  # at once, as the sweep forwards a stop
            stop_worker(worker)
            worker.results.close()
            for _ in range(300):  # a worker that swallowed the signal exits when its task pipe closes
                pid, status = os.waitpid(worker.pid, os.WNOHANG)
                if pid:
                    outcomes.append(os.waitstatus_to_exitcode(status))
                    break
                time.sleep(0.1)
            else:
                os.kill(worker.pid, signal.SIGKILL)
                os.waitpid(worker.pid, 0)
                outcomes.append("still running after 30 s")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert outcomes == [-signal.SIGTERM] * 20
