"""An output folder that appears whole or not at all.

``prepare-data`` writes for minutes or hours; an input error half way (a malformed JSONL line), Ctrl-C or a full
disk must not leave complete-looking shards without their ``meta.json``, which a later ``fit`` would read as a
corpus. So everything is written into a fresh folder beside ``--out`` (the same file system, so the final move is
one ``rename``), and that folder becomes ``--out`` only once the last file is written. On any failure it is
removed, with any parent folders this call created, and ``--out`` is as it was. A process killed outright
(SIGKILL, power loss) leaves ``OUT.partial-XXXX`` beside ``--out``, safe to delete.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from lit.errors import UserInputError


def check_new_or_empty(out: Path, what: str = "shards") -> None:
    """Refuse an ``out`` that holds anything: the finished folder replaces it by one rename, which only an empty
    folder allows, and nothing already there is overwritten or mixed with the new files."""
    if out.exists() and not out.is_dir():
        raise UserInputError(f"--out {out} is a file; name a new or empty folder for the {what}")
    held = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if any(name.endswith(".bin") for name in held):
        raise UserInputError(f"{out} already holds shards; pass an empty or new --out (nothing was overwritten)")
    if held:
        shown = ", ".join(held[:3]) + (", ..." if len(held) > 3 else "")
        raise UserInputError(f"{out} already holds files ({shown}); pass an empty or new --out (nothing was "
                             f"overwritten)")


@contextmanager
def staged_folder(out: str | Path) -> Iterator[Path]:
    """Yield a new empty folder beside ``out``; when the block ends without an error it becomes ``out`` (which
    must be new or an empty folder), and when it raises it is removed and the error goes on."""
    out = Path(out)
    check_new_or_empty(out)
    created = _missing_parents(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"{out.name}.partial-", dir=out.parent))
    try:
        yield work
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        for folder in created:  # deepest first; only what this call made, and only while empty
            try:
                folder.rmdir()
            except OSError:
                break
        raise
    os.chmod(work, 0o777 & ~_umask())  # mkdtemp's 0700 would shut other users out of the shards
    try:
        os.rename(work, out)  # replaces an empty folder: every file appears at once
    except OSError as e:  # something appeared in --out meanwhile: keep the finished work, say where
        raise UserInputError(f"the finished output could not become {out} ({e.strerror}); it is complete in "
                             f"{work}: move it there yourself") from e


def _missing_parents(out: Path) -> list[Path]:
    missing, folder = [], out.parent
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    return missing


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
