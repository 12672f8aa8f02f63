"""A lock across the processes of one machine whose file is removed when it is released.

``filelock.FileLock`` leaves its file behind (removing it is unsafe there): every test run left ~100 empty lock files
in the temp folder. Removing the file at release is safe with one check: a process that waited on the file may hold
the lock of a file that no longer has a name, while a newcomer creates and locks a new file under that name. So
the lock counts as taken only when the name still points at the file locked; else it is tried again.
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no flock
    fcntl = None


class RemovedLock(AbstractContextManager):
    """``with RemovedLock(path): ...``: one process of this machine at a time; ``path`` exists only meanwhile.

    Blocks until the lock is free. On a system without ``flock`` (Windows) it is ``filelock.FileLock``, whose file
    stays.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._fd: int | None = None
        self._fallback = None
        if fcntl is None:
            from filelock import FileLock

            self._fallback = FileLock(self.path)

    def __enter__(self) -> RemovedLock:
        if self._fallback is not None:
            self._fallback.acquire()
            return self
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                if same_file(os.fstat(fd), self.path):
                    self._fd = fd
                    return self
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)  # the holder before removed the file we waited on: try the name again

    def __exit__(self, *exc_info) -> None:
        if self._fallback is not None:
            self._fallback.release()
            return
        fd, self._fd = self._fd, None
        try:
            # Still holding it: whoever waits on this file finds it without a name once it gets it, and tries again.
            self.path.unlink(missing_ok=True)
        finally:
            os.close(fd)  # releases the lock


def same_file(opened: os.stat_result, path: Path) -> bool:
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    return (opened.st_dev, opened.st_ino) == (named.st_dev, named.st_ino)
