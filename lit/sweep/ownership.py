"""Who is running a sweep's parent or child run, and whether it is still alive.

Every run a sweep drives (the parent, while a local sweep runs; each child while it trains) carries its
owner (host and PID, and the SLURM array task when there is one) and a heartbeat, a tag rewritten every
``BEAT_S`` seconds. The tracking store is the one thing a laptop sweep and SLURM array tasks on other
hosts all share, so the rule only reads tags:

- a run is **live** while its owner may still be running it: a recent beat, and (on this host) its PID alive;
- it is **stale** when its owner is gone: its PID is dead on this host, or it has not beaten for
  ``STALE_AFTER_S`` seconds (a host that died, a process killed with -9 elsewhere), or it is a requeued
  SLURM task's own earlier life (SLURM never runs two lives of one array task at once).

A stale run is marked KILLED and its child runs again (the recovery after ``kill -9``); a live one is left
alone and never run a second time.
"""

from __future__ import annotations

import os
import socket
import threading
import time

from lit.sweep import protocol as P

OWNER_HOST = P.PREFIX + "owner_host"
OWNER_PID = P.PREFIX + "owner_pid"
OWNER_TASK = P.PREFIX + "owner_slurm_task"  # "<array job id>_<task id>" under SLURM
HEARTBEAT = P.PREFIX + "heartbeat"  # unix seconds of the owner's last beat
BEAT_S = 20.0
STALE_AFTER_S = 120.0  # six missed beats: a busy store or a long validation never looks like a dead owner


def slurm_task() -> str | None:
    job, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    return f"{job}_{task}" if job and task else None


def owner_tags(now: float | None = None) -> dict[str, str]:
    tags = {OWNER_HOST: socket.gethostname(), OWNER_PID: str(os.getpid()),
            HEARTBEAT: f"{time.time() if now is None else now:.0f}"}
    task = slurm_task()
    if task:
        tags[OWNER_TASK] = task
    return tags


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def owner_alive(tags: dict[str, str], now: float | None = None) -> bool:
    """Whether the owner named by a run's tags may still be running it (see the module's rule)."""
    now = time.time() if now is None else now
    try:
        beat, pid = float(tags[HEARTBEAT]), int(tags[OWNER_PID])
    except (KeyError, ValueError):
        return False  # no owner recorded (a run of an older sweep): nobody can be running it
    if now - beat > STALE_AFTER_S:
        return False
    if tags.get(OWNER_TASK) and tags.get(OWNER_TASK) == slurm_task():
        return False  # this very array task, requeued: its earlier life is over
    if tags.get(OWNER_HOST) == socket.gethostname():
        return pid != os.getpid() and pid_alive(pid)
    return True


def describe_owner(tags: dict[str, str], now: float | None = None) -> str:
    now = time.time() if now is None else now
    task = f", SLURM task {tags[OWNER_TASK]}" if tags.get(OWNER_TASK) else ""
    try:
        ago = f"{now - float(tags[HEARTBEAT]):.0f} s ago"
    except (KeyError, ValueError):
        ago = "never"
    return f"PID {tags.get(OWNER_PID, '?')} on {tags.get(OWNER_HOST, '?')}{task} (last beat {ago})"


class Heartbeat:
    """Rewrites a run's heartbeat tag every ``BEAT_S`` seconds from a thread, until stopped.

    Only for processes that fork nothing that uses the store afterwards (a child run): the sweep process
    itself forks its children, so it beats from its own loop (``beat_now``) instead of from a thread.
    """

    def __init__(self, client, run_id: str, interval: float = BEAT_S):
        self.client, self.run_id, self.interval = client, run_id, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sweep-heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            beat_now(self.client, self.run_id)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)


def beat_now(client, run_id: str) -> None:
    try:
        client.set_tag(run_id, HEARTBEAT, f"{time.time():.0f}")
    except Exception:  # a store that is briefly away: the next beat tries again, staleness allows for six
        pass
