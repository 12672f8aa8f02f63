"""What a checkpoint contains, MLflow has: a SIGKILL between two sends of the metric outbox loses no logged step, and
the resumed training logs no step twice (real `cli.py fit` processes, killed and resumed)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import lightning as L
import mlflow
import pytest
from mlflow.entities import Metric

from lit.cli import main
from lit.tracking.run import mlflow_logger
from lit.tracking.sync import main as sync
from tests.conftest import REPO, TINY_LM, subprocess_env

BASELINE = str(REPO / "recipes" / "gpt_baseline.yaml")
EVERY = 4  # a checkpoint every 4 optimizer steps


class HoldMetricsThenKill(L.Callback):
    """Makes the outbox's timing deterministic, then kills the process with SIGKILL (no cleanup runs).

    At the start of the batch after ``send_at`` optimizer steps everything logged so far is sent, and from then on the
    outbox's sends wait (they take its send lock, held here for good): MLflow has exactly the steps before
    ``send_at``. At the start of the batch after ``kill_at`` steps, SIGKILL, as the outbox's one-second rhythm would
    leave things anywhere in a real run.
    """

    def __init__(self, send_at: int, kill_at: int):
        self.send_at, self.kill_at = send_at, kill_at

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        if trainer.global_step == self.send_at:
            outbox = mlflow_logger(trainer)._outbox
            assert outbox.send()
            outbox._send_lock.acquire()
        if trainer.global_step == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)


def killer(send_at: int, kill_at: int) -> str:
    return (f"--trainer.callbacks=[{{class_path: tests.test_tracking_kill_resume.HoldMetricsThenKill, "
            f"init_args: {{send_at: {send_at}, kill_at: {kill_at}}}}}]")


def fit_args(steps: int, *extra: str) -> list[str]:
    return ["fit", "--config", BASELINE, *TINY_LM, f"--trainer.max_steps={steps}", "--trainer.val_check_interval=null",
            "--trainer.limit_val_batches=0", "--trainer.log_every_n_steps=1",
            "--trainer.logger.init_args.system_metrics=false", f"--checkpoint.every_n_train_steps={EVERY}", *extra]


def killed_at(folder: Path, steps: int, send_at: int, kill_at: int, resume: Path | None = None) -> Path:
    """Runs a fit in a process of its own that is killed; the checkpoint it leaves (``last.ckpt``)."""
    extra = [f"--ckpt_path={resume}"] if resume is not None else []
    command = [sys.executable, str(REPO / "cli.py"), *fit_args(steps, killer(send_at, kill_at), *extra)]
    proc = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=300, env=subprocess_env())
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    (last,) = folder.glob("runs/*/*/checkpoints/last.ckpt")
    return last


def resume(steps: int, last: Path) -> None:
    main(fit_args(steps, f"--ckpt_path={last}"))  # in this process: one import of torch, Lightning and MLflow less


def history(folder: Path, key: str) -> list[int]:
    client = mlflow.MlflowClient(f"sqlite:///{folder}/mlflow.db")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    return sorted(m.step for m in client.get_metric_history(run.info.run_id, key))


def assert_every_step_once(folder: Path, steps: int) -> None:
    for key in ("train/loss", "train/lr"):
        logged = history(folder, key)
        twice = sorted(s for s, n in Counter(logged).items() if n > 1)
        assert logged == list(range(steps)), f"{key}: missing {sorted(set(range(steps)) - set(logged))}, twice {twice}"


def test_steps_in_a_checkpoint_but_not_yet_sent_arrive_after_a_sigkill(workdir_with_store):
    # MLflow has steps 0-1; the checkpoint of step 4 holds 0-3; the kill at step 6 loses the outbox (2-5).
    # Steps 2-3 come back from the checkpoint; 4-5 are trained again.
    last = killed_at(workdir_with_store, 8, send_at=2, kill_at=6)
    resume(8, last)
    assert_every_step_once(workdir_with_store, 8)


def test_a_journal_sent_after_a_resume_adds_only_the_steps_the_run_lacks(workdir_with_store):
    # Killed while the store was away: the journal kept steps 0-5, and the resumed training has logged 0-3 since.
    client = mlflow.MlflowClient(f"sqlite:///{workdir_with_store}/mlflow.db")
    run_id = client.create_run(client.create_experiment("journal")).info.run_id
    client.log_batch(run_id, metrics=[Metric("train/loss", 1.0, 0, s) for s in range(4)])
    journal = workdir_with_store / "unsent_metrics.jsonl"
    header = {"tracking_uri": f"sqlite:///{workdir_with_store}/mlflow.db", "run_id": run_id, "status": None}
    kept = [{"key": "train/loss", "value": 2.0, "timestamp": 0, "step": s} for s in range(6)]
    journal.write_text("\n".join(json.dumps(line) for line in [header, *kept]) + "\n")  # as MetricOutbox.keep writes
    assert sync(["send", str(journal)]) == 0
    assert [(m.step, m.value) for m in sorted(client.get_metric_history(run_id, "train/loss"), key=lambda m: m.step)] \
        == [(0, 1.0), (1, 1.0), (2, 1.0), (3, 1.0), (4, 2.0), (5, 2.0)]


@pytest.mark.slow  # three fits, two of them killed (~40 s on 2 busy cores)
def test_two_sigkills_lose_no_step_and_log_none_twice(workdir_with_store):
    # Kill 1, as above: steps 2-3 only in the checkpoint of step 4. Kill 2, resumed from step 4: everything up to
    # step 9 reaches MLflow, past the checkpoint of step 8, and the kill at step 10 sends the training back to step
    # 8; steps 8-9, trained again, are already in MLflow.
    last = killed_at(workdir_with_store, 12, send_at=2, kill_at=6)
    last = killed_at(workdir_with_store, 12, send_at=10, kill_at=10, resume=last)
    resume(12, last)
    assert_every_step_once(workdir_with_store, 12)
