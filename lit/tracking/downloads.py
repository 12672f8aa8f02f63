"""Quiet artifact downloads: MLflow draws a progress bar on stderr for every download, even of a 1 kB file, and the
commands keep their stderr for their warnings and their one error line."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

PROGRESS_BAR = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"


@contextmanager
def quiet_downloads() -> Iterator[None]:
    """No progress bar for the downloads inside; MLflow reads the switch at each download."""
    saved = os.environ.get(PROGRESS_BAR)
    os.environ[PROGRESS_BAR] = "false"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(PROGRESS_BAR, None)
        else:
            os.environ[PROGRESS_BAR] = saved
