"""Checkpoints written whole or not at all.

Every checkpoint (``last.ckpt``, each ``step=`` file, a sharded checkpoint directory) is written under a hidden
temporary name in its own directory, flushed to the disk (fsync) and renamed into place. A rename within one
directory is atomic, so a reader sees the old checkpoint or the new one, never a part of one.

Lightning's own writer stages the file in the system's temporary directory and moves it across filesystems
afterwards: when the checkpoint disk filled, the move left a truncated file under the checkpoint's name and the
run ended in a traceback. Here a full disk or an exceeded quota removes the partial file and ends the run in one
``error:`` line that names the last intact checkpoint (``lit.errors.StorageFullError``).
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from lit.errors import StorageFullError

# Errors the user fixes by freeing space or pointing the checkpoints elsewhere; any other OSError is a bug or a
# broken disk and keeps its traceback.
FULL_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
PARTIAL_MARK = ".partial"  # no ".ckpt" suffix: Lightning's and our globs for checkpoints never see a partial one


def partial_path(path: Path) -> Path:
    """Where ``path`` is written before it is renamed into place: hidden, in the same directory (same filesystem)."""
    return path.with_name(f".{path.name}{PARTIAL_MARK}")


def _open_for_writing(path: Path):
    return open(path, "wb")


def _fsync_directory(folder: Path) -> None:
    # The rename itself lives in the directory: without this a power cut may forget it.
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def full_disk_cause(exc: BaseException | None) -> OSError | None:
    """The full-disk ``OSError`` behind ``exc``: itself, in its cause chain, or in the per-rank failures that
    ``torch.distributed.checkpoint`` gathers into one ``CheckpointException``."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in FULL_DISK_ERRNOS:
            return exc
        for failure in getattr(exc, "failures", {}).values():  # CheckpointException: rank -> (exception, trace)
            found = full_disk_cause(failure[0] if isinstance(failure, tuple) else failure)
            if found is not None:
                return found
        exc = exc.__cause__ or exc.__context__
    return None


def write_file_whole(checkpoint: dict[str, Any], path: str | Path) -> Path:
    """``torch.save`` to ``path`` so that ``path`` holds the whole new checkpoint or whatever it held before."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = partial_path(path)
    try:
        with _open_for_writing(partial) as f:
            torch.save(checkpoint, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)
    return path


def begin_directory(path: Path) -> Path:
    """A fresh hidden sibling folder of ``path`` to write a sharded checkpoint into (``finish_directory`` puts it in
    place). Called by one process; every process then writes its shard into it."""
    partial = partial_path(path)
    for leftover in (partial, aside_path(path)):
        _remove(leftover)
    partial.mkdir(parents=True)
    return partial


def aside_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.old")


def finish_directory(path: Path) -> Path:
    """Flush the folder ``begin_directory`` made and put it in place of ``path``.

    A directory cannot replace another in one rename: the old checkpoint is first renamed aside, so for an instant
    ``path`` is absent, but it never names a partly written checkpoint.
    """
    partial, old = partial_path(path), aside_path(path)
    for file in partial.rglob("*"):
        if file.is_file():
            with open(file, "rb") as f:
                os.fsync(f.fileno())
    if path.exists() or path.is_symlink():
        os.replace(path, old)
    try:
        os.replace(partial, path)
    except BaseException:
        if old.exists() and not path.exists():
            os.replace(old, path)  # the previous checkpoint goes back under its name
        raise
    _remove(old)
    _fsync_directory(path.parent)
    return path


def discard_directory(path: Path) -> None:
    _remove(partial_path(path))


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists():
        path.unlink()


def newest_checkpoint_beside(path: Path) -> Path | None:
    """The most recently written checkpoint next to ``path`` (``path`` itself included: a failed write leaves the
    previous one intact), or None."""
    folder = path.parent
    if not folder.is_dir():
        return None
    found = [p for p in folder.iterdir() if not p.name.startswith(".") and (p.suffix == ".ckpt" or p.is_dir())]
    return max(found, key=lambda p: p.stat().st_mtime, default=None)


def full_disk_error(path: Path, exc: OSError, last_intact: tuple[Path, Any] | None) -> StorageFullError:
    where = f"{os.strerror(exc.errno)} while writing checkpoint {path}; nothing was left under that name"
    if last_intact is None:
        found = newest_checkpoint_beside(path)
        last_intact = (found, None) if found is not None else None
    if last_intact is None:
        return StorageFullError(f"{where}. No intact checkpoint was written. Free space or set "
                                f"--checkpoint.dirpath to a disk with room, then run again")
    intact, step = last_intact
    at_step = f" (step {step})" if step is not None else ""
    return StorageFullError(f"{where}. The last intact checkpoint is {intact}{at_step}: free space or set "
                            f"--checkpoint.dirpath to a disk with room, then resume with --ckpt_path={intact}")


class WholeCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint writer with ``write_file_whole`` in place of its cross-filesystem move."""

    def __init__(self) -> None:
        super().__init__()
        self.last_intact: tuple[Path, Any] | None = None  # (path, step) of the newest checkpoint written whole

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options")
        if "://" in str(path):  # object stores: Lightning's own transaction is already all-or-nothing
            return super().save_checkpoint(checkpoint, path)
        path = Path(path)
        try:
            write_file_whole(checkpoint, path)
        except Exception as exc:  # torch's zip writer may wrap the OSError in a RuntimeError as it closes
            full = full_disk_cause(exc)
            if full is not None:
                raise full_disk_error(path, full, self.last_intact) from exc
            raise
        self.last_intact = (path, checkpoint.get("global_step"))


def install(trainer) -> None:
    """Put ``WholeCheckpointIO`` into ``trainer``'s strategy, unless the user chose a checkpoint writer of their own."""
    strategy = trainer.strategy
    current = getattr(strategy, "_checkpoint_io", None)
    if current is None or type(current) is TorchCheckpointIO:
        strategy.checkpoint_io = WholeCheckpointIO()


def save_sharded_whole(strategy, checkpoint: dict[str, Any], filepath) -> None:
    """``ModelParallelStrategy.save_checkpoint``'s sharded branch, written whole: every rank writes its shard into
    one hidden folder, which rank 0 flushes and renames into place once all are done."""
    from lightning.fabric.strategies.fsdp import _METADATA_FILENAME, _distributed_checkpoint_save

    path = Path(strategy.broadcast(filepath))
    if strategy.global_rank == 0:
        begin_directory(path)
    strategy.barrier("begin sharded checkpoint")
    partial = partial_path(path)
    try:
        converted = {"state_dict": checkpoint.pop("state_dict")}
        converted.update({f"optimizer_{i}": state for i, state in enumerate(checkpoint.pop("optimizer_states", []))})
        _distributed_checkpoint_save(converted, partial)
        if strategy.global_rank == 0:
            write_file_whole(checkpoint, partial / _METADATA_FILENAME)
            finish_directory(path)
    except BaseException as exc:  # torch.distributed.checkpoint raises a CheckpointException, a BaseException
        if strategy.global_rank == 0:
            discard_directory(path)
        full = full_disk_cause(exc)
        if full is not None:
            raise full_disk_error(path, full, getattr(strategy, "last_intact_checkpoint", None)) from exc
        raise
    strategy.barrier("sharded checkpoint in place")
    strategy.last_intact_checkpoint = (path, checkpoint.get("global_step"))
