"""Metrics on their way to the tracking store: sent in the background, kept until the store has them.

MLflow's own asynchronous queue drops a batch it failed to send (it logs an error and moves on), so a
tracking server that went away for a minute silently cost that minute of metrics. The outbox keeps
every value until a send succeeds:

- ``put`` only appends (a training step never waits for the store); a thread sends what is pending
  once per ``interval`` as few ``log_batch`` requests as MLflow allows (one per second, as before), or at once
  after ``send_soon``.
- ``unsent`` is what a checkpoint keeps (``checkpointed_metrics.py``): a SIGKILL loses the outbox, not them.
- A failed send leaves everything pending, says so once, retries every ``retry_interval`` and says
  when the store is back. While it is down, the pending values are also written to ``journal`` (a
  local JSON-lines file), so a process killed during the outage loses nothing either.
- ``close`` sends what is left, waiting at most ``timeout`` seconds for a store that is still down; what
  could not be sent stays in the journal, with the run's final status, for
  ``python cli.py sync send JOURNAL``.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from lit.tracking.batches import MAX_METRICS_PER_BATCH, batches

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Metric

log = logging.getLogger(__name__)


class MetricOutbox:
    """Args:
        client: the tracking client.
        run_id: the run the metrics belong to.
        journal: where pending values are kept while the store cannot be reached.
        interval: seconds between two sends.
        retry_interval: seconds between two attempts while the store is down.
    """

    def __init__(self, client: MlflowClient, run_id: str, journal: Path, interval: float = 1.0,
                 retry_interval: float = 5.0):
        self.client, self.run_id, self.journal = client, run_id, Path(journal)
        self.interval, self.retry_interval = interval, retry_interval
        self._pending: list[Metric] = []
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()  # one send at a time (the thread, or close)
        self._wake, self._stop = threading.Event(), threading.Event()
        self.down_since: float | None = None  # when the first send of the current outage failed
        self.sent = 0
        self._thread = threading.Thread(target=self._loop, name="MetricOutbox", daemon=True)
        self._thread.start()

    def put(self, metrics: list[Metric]) -> None:
        with self._lock:
            self._pending.extend(metrics)

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def unsent(self) -> list[Metric]:
        """The values not yet confirmed sent (those being sent now included)."""
        with self._lock:
            return list(self._pending)

    def send_soon(self) -> None:
        """Send now rather than at the end of the interval, without waiting for it (nor during an outage)."""
        if self.down_since is None:
            self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.retry_interval if self.down_since is not None else self.interval)
            self._wake.clear()
            if not self._stop.is_set():
                self.send()

    def send(self) -> bool:
        """Send everything pending now; True when nothing is left."""
        with self._send_lock:
            with self._lock:
                batch = list(self._pending)
            try:
                for part in batches(batch, MAX_METRICS_PER_BATCH):
                    self.client.log_batch(self.run_id, metrics=part, synchronous=True)
                    with self._lock:  # what was sent leaves the outbox; what came meanwhile stays
                        del self._pending[:len(part)]
                    self.sent += len(part)
            except Exception as exc:  # any failure of the store or the network: keep, retry, say so once
                if self.down_since is None:
                    self.down_since = time.time()
                    log.warning(f"the tracking store cannot take metrics now ({short_error(exc)}); training goes on, "
                                f"metrics are kept ({self.journal}) and sent when it is back")
                self.keep()
                return False
            if self.down_since is not None:
                log.warning(f"the tracking store is back after {time.time() - self.down_since:.0f} s; "
                            f"the metrics kept meanwhile are sent")
                self.down_since = None
                self.journal.unlink(missing_ok=True)
            return True

    def close(self, timeout: float, status: str | None = None) -> int:
        """Stop the thread and send what is left, retrying for at most ``timeout`` seconds.

        Returns how many values could not be sent: they are in ``journal``, with ``status``.
        """
        self._stop.set()
        self._wake.set()
        self._thread.join()
        deadline = time.time() + timeout
        while not self.send() and time.time() < deadline:
            time.sleep(min(self.retry_interval, max(0.0, deadline - time.time())))
        left = self.pending
        if left:
            self.keep(status)
        return left

    def keep(self, status: str | None = None) -> None:
        """Write what is pending, and the run's final ``status`` if known, to the journal (``sync send`` reads it)."""
        with self._lock:
            pending = list(self._pending)
        header = {"tracking_uri": self.client.tracking_uri, "run_id": self.run_id, "status": status}
        self.journal.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.journal.with_suffix(".tmp")
        with open(tmp, "w") as f:  # written whole, then renamed: a kill mid-write leaves the previous journal
            f.write(json.dumps(header) + "\n")
            for m in pending:
                f.write(json.dumps({"key": m.key, "value": m.value, "timestamp": m.timestamp, "step": m.step}) + "\n")
        os.replace(tmp, self.journal)


def short_error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200] if text else ''}"
