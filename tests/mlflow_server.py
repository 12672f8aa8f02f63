"""A real `mlflow server` on 127.0.0.1 for tests, which a test may stop and start again on the same port and store."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import free_port


class MlflowServer:
    def __init__(self, root: Path):
        self.root, self.port = Path(root), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self, wait: bool = True) -> MlflowServer:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(self.port),
             "--backend-store-uri", f"sqlite:///{self.root}/server.db", "--artifacts-destination",
             str(self.root / "artifacts"), "--workers", "1"],
            # A file, not a pipe: a long-lived server logging every request would fill a pipe and block.
            stdout=subprocess.DEVNULL, stderr=open(self.root / "server.log", "ab"), cwd=self.root,
            start_new_session=True,  # its own process group: stop() takes its uvicorn workers with it
            # Without MLflow's job runner: the tests use no server-side jobs, and it starts about five huey consumer
            # processes, each importing mlflow, beside every server (seconds of CPU on a 2-core machine).
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.time() + timeout
        while True:
            try:
                urllib.request.urlopen(f"{self.url}/health", timeout=2)
                return
            except OSError:
                if self.process.poll() is not None or time.time() > deadline:
                    self.process.kill()
                    log = (self.root / "server.log").read_text(errors="replace")
                    pytest.fail(f"mlflow server did not start: {log[-2000:]}")
                time.sleep(0.5)

    def stop(self) -> None:
        """Gone at once, as in a crash: its port refuses connections until it is started again."""
        if self.process is not None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait()
        self.process = None
