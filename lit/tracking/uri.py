"""Where runs go: the tracking URI a run, a sweep or a comparison uses, and the lock that lets processes started
together create a new sqlite store without racing."""

from __future__ import annotations

import hashlib
import os
import tempfile
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

from lit.tracking.removed_lock import RemovedLock

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
LOCK_PREFIX = "arch-lab-mlflow-"  # in the temp folder, while a process creates or opens a sqlite store
SQLITE = "sqlite:///"


def sqlite_path(uri: str) -> str | None:
    """The database path of a sqlite URI (relative or absolute), or None for other stores and in-memory ones."""
    if not uri.startswith(SQLITE) or ":memory:" in uri:
        return None
    return uri[len(SQLITE):]


def resolve_tracking_uri(given: str | None) -> str:
    """The store a run, a sweep or a comparison uses: the URI given, else ``$MLFLOW_TRACKING_URI`` (read now,
    not at import), else ``sqlite:///mlflow.db``; a relative sqlite path is resolved against this folder."""
    return absolute_sqlite(given or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI)


def absolute_sqlite(uri: str) -> str:
    """``sqlite:///mlflow.db`` -> ``sqlite:////abs/path/mlflow.db``: the launch folder is resolved once.

    MLflow caches one database engine per URI string, so a relative URI would keep writing to the
    first folder's database in a process that changes directory (notebooks, tests).
    """
    path = sqlite_path(uri)
    if path is None or path.startswith("/"):
        return uri
    return SQLITE + str(Path(path).resolve())


def sqlite_creation_lock(uri: str) -> AbstractContextManager:
    """A lock across the processes of this machine for a sqlite URI (nothing for other stores).

    Every process builds a client, which creates the tables of a new sqlite database; processes started
    together (torchrun, SLURM) would race in MLflow's migrations and one would crash. The lock file lives
    in the temp folder, named after the database path, not beside the database (whose folder may not exist
    yet), and is removed when the lock is released (``removed_lock.py``).
    """
    path = sqlite_path(uri)
    if path is None:
        return nullcontext()
    digest = hashlib.sha1(path.encode()).hexdigest()[:16]
    return RemovedLock(Path(tempfile.gettempdir()) / f"{LOCK_PREFIX}{digest}.lock")
