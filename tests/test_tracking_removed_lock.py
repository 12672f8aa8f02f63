"""The lock that lets processes started together create a new sqlite store leaves no file behind, and stays a lock
while its file comes and goes (the processes-started-together test is in tests/test_tracking_distributed.py)."""

from __future__ import annotations

import tempfile
import threading
import time

from lit.cli import main
from lit.tracking.removed_lock import RemovedLock
from lit.tracking.uri import LOCK_PREFIX
from tests.conftest import REPO, TINY_LM


def test_one_holder_at_a_time_while_the_file_is_removed_at_each_release(tmp_path):
    # flock is per open file, so threads contend as processes do. Each release removes the file while others wait on
    # it; a newcomer then creates a new one. Without the check that the name still points at the locked file, a
    # waiter and a newcomer both get "the" lock.
    path, inside, most, entries = tmp_path / "store.lock", [0], [0], []
    count = threading.Lock()

    def worker() -> None:
        for _ in range(10):
            with RemovedLock(path):
                with count:
                    inside[0] += 1
                    most[0] = max(most[0], inside[0])
                    entries.append(path.exists())
                time.sleep(0.002)
                with count:
                    inside[0] -= 1

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1
    assert len(entries) == 80 and all(entries)  # the holder's file has its name
    assert not path.exists()


def test_a_fit_leaves_no_lock_file_in_the_temp_folder(workdir_with_store, tmp_path, monkeypatch):
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    main(["fit", "--config", str(REPO / "recipes" / "gpt_baseline.yaml"), *TINY_LM, "--trainer.max_steps=2",
          "--trainer.limit_val_batches=0", "--trainer.logger.init_args.system_metrics=false"])
    assert not list(temp.glob(f"{LOCK_PREFIX}*")), list(temp.iterdir())
