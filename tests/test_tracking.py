"""MLflow tracking: a real sqlite store by default, the environment's URI, and a real `mlflow server`."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request

import mlflow
import pytest

from lit.cli import main
from tests.conftest import REPO, TINY_LM

BASELINE = str(REPO / "recipes" / "gpt_baseline.yaml")
SHORT = ["--trainer.max_steps=3", "--trainer.val_check_interval=3", "--trainer.limit_val_batches=1",
         "--trainer.log_every_n_steps=1"]


def only_run(uri: str, experiment: str = "gpt-tinyshakespeare"):
    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    assert len(runs) == 1
    return client, runs[0]


def assert_complete_run(client, run):
    assert {"train/loss", "train/lr", "train/tokens_per_s", "val/loss", "val/ppl"} <= set(run.data.metrics)
    params = run.data.params
    assert params["model.init_args.arch.norm"] == "rmsnorm" and params["model.init_args.arch.d_model"] == "32"
    assert params["trainer.max_steps"] == "3"
    tags = run.data.tags
    assert tags["plugin.norm"] == "rmsnorm" and tags["plugin.residual"] == "add"
    assert tags["plugin.projection.package"].startswith("arch-lab==")
    assert len(tags["mlflow.source.git.commit"]) == 40  # the project is a git checkout
    config = mlflow.artifacts.load_text(f"{run.info.artifact_uri}/config.yaml")
    assert "class_path: lit.language_model.LanguageModel" in config and "d_model: 32" in config


def test_fit_logs_to_sqlite_by_default(workdir):
    main(["fit", "--config", BASELINE, *TINY_LM, *SHORT])
    assert (workdir / "mlflow.db").is_file()
    client, run = only_run("sqlite:///mlflow.db")
    assert_complete_run(client, run)
    ckpts = workdir / "runs" / run.info.experiment_id / run.info.run_id / "checkpoints"
    assert (ckpts / "last.ckpt").is_file()
    # A second run in the same folder is a new run, not a config.yaml collision (Lightning #20184).
    main(["fit", "--config", BASELINE, *TINY_LM, *SHORT, "--trainer.logger.init_args.experiment_name=second"])
    assert len(only_run("sqlite:///mlflow.db", "second")[1].data.metrics) > 0


def test_tracking_uri_from_the_environment(workdir, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{workdir}/elsewhere.db")
    main(["fit", "--config", BASELINE, *TINY_LM, *SHORT])
    assert not (workdir / "mlflow.db").exists()
    only_run(f"sqlite:///{workdir}/elsewhere.db")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def mlflow_server(tmp_path):
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
         "--backend-store-uri", f"sqlite:///{tmp_path}/server.db", "--artifacts-destination",
         str(tmp_path / "artifacts"), "--workers", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=tmp_path)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 90
    while True:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=2)
            break
        except OSError:
            if server.poll() is not None or time.time() > deadline:
                server.kill()
                pytest.fail(f"mlflow server did not start: {server.stderr.read().decode()[-2000:]}")
            time.sleep(0.5)
    yield url
    server.terminate()
    server.wait(timeout=30)


def test_fit_logs_to_a_real_mlflow_server(workdir, mlflow_server):
    main(["fit", "--config", BASELINE, *TINY_LM, *SHORT, f"--trainer.logger.init_args.tracking_uri={mlflow_server}"])
    assert not (workdir / "mlflow.db").exists()
    client, run = only_run(mlflow_server)
    assert_complete_run(client, run)
