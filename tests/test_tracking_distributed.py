"""MLflow under 2 processes (FSDP2 through ModelParallelStrategy, gloo on CPU) against a real `mlflow server`.

The first fit is launched the way torchrun or SLURM do it, one process per "node" started from outside
(NODE_RANK 0 and 1, LOCAL_RANK 0 each): both are local rank 0 of their node, so each logs its node's
system metrics, and node 1's can only land in the run if rank 0's run id reached it. The resume is
launched by Lightning itself (2 devices on one node, the script re-executed), from the sharded
checkpoint directory the first fit wrote (slow tier). And processes started at once on a new sqlite database
(slow tier).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from lit.tracking.run import checkpoint_run
from tests.conftest import REPO, TINY_LM, free_port, subprocess_env
from tests.test_tracking import (  # noqa: F401  (mlflow_server is a fixture)
    BASELINE,
    FAST_SYSTEM_METRICS,
    SHORT,
    artifact_files,
    assert_complete_run,
    mlflow_server,
    only_run,
    steps,
)

FSDP2 = ["--trainer.accelerator=cpu", "--trainer.strategy=lightning.pytorch.strategies.ModelParallelStrategy",
         "--trainer.strategy.init_args.data_parallel_size=2", "--trainer.strategy.init_args.tensor_parallel_size=1"]
SHARDED = {"__0_0.distcp", "__1_0.distcp", ".metadata", "meta.pt"}  # what a 2-rank DCP checkpoint holds


def cli_fit(tracking_uri: str, *args: str) -> list[str]:
    return [sys.executable, str(REPO / "cli.py"), "fit", "--config", BASELINE, *TINY_LM, *SHORT, *FAST_SYSTEM_METRICS,
            *FSDP2, f"--trainer.logger.init_args.tracking_uri={tracking_uri}", *args]


def fit_on_two_nodes(cwd, tracking_uri: str, *args: str) -> None:
    command = cli_fit(tracking_uri, "--trainer.num_nodes=2", "--trainer.devices=1", *args)
    port = str(free_port())
    nodes = [subprocess.Popen(command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              env=subprocess_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, NODE_RANK=str(rank),
                                              LOCAL_RANK="0"))
             for rank in (0, 1)]
    try:
        errors = [node.communicate(timeout=300)[1] for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    for node, err in zip(nodes, errors, strict=True):
        assert node.returncode == 0, err[-3000:]


def fit_on_two_devices(cwd, tracking_uri: str, *args: str) -> None:
    proc = subprocess.run(cli_fit(tracking_uri, "--trainer.devices=2", *args), cwd=cwd, capture_output=True,
                          text=True, timeout=300, env=subprocess_env())
    assert proc.returncode == 0, proc.stderr[-3000:]


def two_processes_log_one_run_with_sharded_checkpoints(tmp_path, tracking_uri: str) -> tuple[str, Path]:
    """The fit on two "nodes" and what its one run holds: (its run id, its checkpoint folder)."""
    fit_on_two_nodes(tmp_path, tracking_uri, "--trainer.logger.init_args.log_model=all")
    client, run = only_run(tracking_uri)  # rank 1 created no run of its own
    run_id = run.info.run_id
    assert_complete_run(client, run)
    assert steps(client, run_id, "train/loss") == [0, 1, 2]
    for node in ("node_0", "node_1"):
        assert {f"system/{node}/cpu_utilization_percentage",
                f"system/{node}/system_memory_usage_megabytes"} <= set(run.data.metrics)
    # Sharded checkpoints are directories; each is logged whole under <stem>/<name>/.
    for stem in ("last", "epoch=0-step=3"):
        assert {f"{stem}/{stem}.ckpt", f"{stem}/metadata.yaml", f"{stem}/aliases.txt"} <= artifact_files(
            client, run_id, stem)
        assert {f"{stem}/{stem}.ckpt/{f}" for f in SHARDED} == artifact_files(client, run_id, f"{stem}/{stem}.ckpt")
    folder = tmp_path / "runs" / run.info.experiment_id / run_id / "checkpoints"
    assert checkpoint_run(folder / "last.ckpt")["run_id"] == run_id  # read from the directory's meta.pt
    return run_id, folder


def test_two_processes_log_one_run_with_sharded_checkpoints(tmp_path, mlflow_server):  # noqa: F811
    two_processes_log_one_run_with_sharded_checkpoints(tmp_path, mlflow_server)


# Slow (one more 2-process fit, about 45 s of the default run on 2 shared cores). By default a sharded checkpoint
# resumes under FSDP2 on 2 processes to the same weights (test_sharded_checkpoints.py), a resumed fit logs into its
# checkpoint's run (test_tracking.py), and the run id is read from a sharded checkpoint's meta.pt (above).
@pytest.mark.slow
def test_two_processes_resume_a_sharded_checkpoint_into_its_run(tmp_path, mlflow_server):  # noqa: F811
    run_id, folder = two_processes_log_one_run_with_sharded_checkpoints(tmp_path, mlflow_server)
    fit_on_two_devices(tmp_path, mlflow_server, "--trainer.max_steps=6", "--ckpt_path", str(folder / "last.ckpt"))
    client, resumed = only_run(mlflow_server)
    assert resumed.info.run_id == run_id and resumed.info.status == "FINISHED"
    assert steps(client, run_id, "train/loss") == [0, 1, 2, 3, 4, 5]
    assert {"system/cpu_utilization_percentage", "system/system_memory_usage_megabytes"} <= set(resumed.data.metrics)
    assert {p.name for p in (folder / "epoch=0-step=6.ckpt").iterdir()} == SHARDED  # the same folder


NEW_DATABASE_AT_ONCE = """
import sys, time
from pathlib import Path
from lit.tracking import MLflowLogger
uri, folder, name = sys.argv[1:]
(Path(folder) / name).touch()
while not (Path(folder) / "go").exists():
    time.sleep(0.005)
MLflowLogger(tracking_uri=uri)
"""


# Slow (about a minute: three processes importing MLflow and Lightning on 2 cores). The lock it relies on is checked
# in the default run with 8 contending threads (tests/test_tracking_removed_lock.py), and every default fit creates
# its store through it.
@pytest.mark.slow
def test_processes_started_together_share_a_new_sqlite_database(tmp_path):
    # torchrun and SLURM start every process at once, and each builds a logger: without the lock,
    # MLflow's table creation races and some processes die in its migrations.
    uri, n = f"sqlite:///{tmp_path}/new.db", 3
    processes = [subprocess.Popen([sys.executable, "-c", NEW_DATABASE_AT_ONCE, uri, str(tmp_path), f"ready{i}"],
                                  cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                  env=subprocess_env()) for i in range(n)]
    deadline = time.time() + 120
    while len(list(tmp_path.glob("ready*"))) < n and time.time() < deadline:  # all imported: go at once
        time.sleep(0.05)
    (tmp_path / "go").touch()
    errors = [p.communicate(timeout=120)[1] for p in processes]
    assert [p.returncode for p in processes] == [0] * n, "\n".join(e[-1500:] for e in errors)
