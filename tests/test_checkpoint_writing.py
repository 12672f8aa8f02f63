"""Checkpoints written whole or not at all: a full disk leaves no truncated file under a checkpoint's name and ends
in one line that names the last intact checkpoint (lit/checkpoint_writing.py)."""

from __future__ import annotations

import errno
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from lit import checkpoint_writing
from lit.checkpoint_writing import WholeCheckpointIO, partial_path, save_sharded_whole, write_file_whole
from lit.errors import StorageFullError
from tests.conftest import REPO, TINY_LM

BASELINE = str(REPO / "recipes" / "gpt_baseline.yaml")


class FillsUpAfter:
    """A file that takes ``room`` bytes and then fails as a full disk does (a write that fails partway)."""

    def __init__(self, path: Path, room: int):
        self.file, self.room = open(path, "wb"), room

    def write(self, data) -> int:
        data = bytes(data)
        if len(data) > self.room:
            self.file.write(data[:self.room])
            self.room = 0
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= len(data)
        return self.file.write(data)

    def __getattr__(self, name):
        return getattr(self.file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()


def a_checkpoint(step: int) -> dict:
    return {"global_step": step, "state_dict": {"w": torch.full((20_000,), float(step))}}


def only_whole_checkpoints(folder: Path) -> list[Path]:
    """Every file in ``folder``, each asserted loadable; no partial file anywhere."""
    files = sorted(p for p in folder.iterdir())
    assert not [p for p in files if p.name.startswith(".")], files
    for p in files:
        if p.is_file():
            torch.load(p, map_location="cpu", weights_only=True)  # a truncated file raises here
    return files


def test_a_write_that_fails_partway_leaves_the_previous_checkpoint_whole(tmp_path, monkeypatch):
    io = WholeCheckpointIO()
    io.save_checkpoint(a_checkpoint(10), tmp_path / "step=10.ckpt")
    io.save_checkpoint(a_checkpoint(10), tmp_path / "last.ckpt")
    monkeypatch.setattr(checkpoint_writing, "_open_for_writing", lambda path: FillsUpAfter(path, room=30_000))
    for name in ("step=20.ckpt", "last.ckpt"):
        with pytest.raises(StorageFullError) as error:
            io.save_checkpoint(a_checkpoint(20), tmp_path / name)
        message = str(error.value)
        assert f"The last intact checkpoint is {tmp_path / 'last.ckpt'} (step 10)" in message, message
        assert "nothing was left under that name" in message and "--ckpt_path=" in message
    assert [p.name for p in only_whole_checkpoints(tmp_path)] == ["last.ckpt", "step=10.ckpt"]
    assert torch.load(tmp_path / "last.ckpt", weights_only=True)["global_step"] == 10  # the old one, whole


def test_a_failure_other_than_a_full_disk_keeps_its_traceback(tmp_path, monkeypatch):
    def broken(path):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(checkpoint_writing, "_open_for_writing", broken)
    with pytest.raises(OSError) as error:
        WholeCheckpointIO().save_checkpoint(a_checkpoint(1), tmp_path / "last.ckpt")
    assert not isinstance(error.value, StorageFullError)


def test_the_file_is_renamed_into_place_only_once_whole(tmp_path, monkeypatch):
    seen = []
    real_replace = checkpoint_writing.os.replace

    def replace(src, dst):
        seen.append((Path(src), Path(dst), Path(dst).exists()))
        return real_replace(src, dst)

    monkeypatch.setattr(checkpoint_writing.os, "replace", replace)
    write_file_whole(a_checkpoint(3), tmp_path / "last.ckpt")
    assert seen == [(partial_path(tmp_path / "last.ckpt"), tmp_path / "last.ckpt", False)]
    assert torch.load(tmp_path / "last.ckpt", weights_only=True)["global_step"] == 3


# --- a real small filesystem ---------------------------------------------------------------------------------------

@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs of 3 MiB mounted for the test (root in a sandbox), else skipped: the injected failure above runs
    everywhere."""
    mount = tmp_path / "small_disk"
    mount.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", str(mount)], check=False)


def test_fit_on_a_disk_that_fills_ends_in_one_line_naming_the_last_intact_checkpoint(workdir, small_disk, capsys):
    from lit.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", BASELINE, *TINY_LM, "--model.arch.d_model=64", "--trainer.max_steps=30",
              "--trainer.val_check_interval=null", "--trainer.limit_val_batches=0",
              "--checkpoint.every_n_train_steps=1", "--checkpoint.save_top_k=-1", f"--checkpoint.dirpath={small_disk}"])
    assert exit_info.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "No space left on device while writing checkpoint" in errors[0], errors
    files = only_whole_checkpoints(small_disk)
    assert len(files) >= 2, files  # some checkpoints fitted before the disk filled
    newest = max(files, key=lambda p: torch.load(p, weights_only=True)["global_step"])
    step = torch.load(newest, weights_only=True)["global_step"]
    assert f"The last intact checkpoint is {small_disk / 'last.ckpt'} (step {step})" in errors[0], errors


def test_a_sharded_checkpoint_on_a_full_disk_leaves_the_previous_one_whole(small_disk):
    from lit.checkpoints import checkpoint_shapes

    class OneProcess:  # what save_sharded_whole asks of a strategy, for one process
        global_rank = 0

        def broadcast(self, value):
            return value

        def barrier(self, name=None):
            pass

    def sharded(step: int, size: int) -> dict:
        return {"global_step": step, "state_dict": {"w": torch.full((size,), float(step))}, "optimizer_states": []}

    strategy, path = OneProcess(), small_disk / "last.ckpt"
    save_sharded_whole(strategy, sharded(1, 100_000), path)
    assert checkpoint_shapes(path) == {"w": (100_000,)}
    with pytest.raises(StorageFullError) as error:
        save_sharded_whole(strategy, sharded(2, 1_000_000), path)  # 4 MB on a 3 MiB disk
    assert f"The last intact checkpoint is {path} (step 1)" in str(error.value)
    assert [p.name for p in small_disk.iterdir()] == ["last.ckpt"]  # no partial folder left
    assert checkpoint_shapes(path) == {"w": (100_000,)}
