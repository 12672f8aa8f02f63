"""MLflow tracking: a real sqlite store by default, the environment's URI, and a real `mlflow server`;
resume into the same run, system metrics (also when a fit fails), checkpoints as artifacts, asynchronous logging
drained before the run ends.

The 2-process (FSDP2) runs against a server are in test_tracking_distributed.py.
"""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path

import lightning as L
import mlflow
import pytest
import torch

from lit.callbacks import MLflowRun
from lit.cli import main
from lit.errors import UserInputError
from lit.tracking import MLflowLogger
from lit.tracking.run import checkpoint_run
from tests.conftest import REPO, TINY_LM
from tests.mlflow_server import MlflowServer

BASELINE = str(REPO / "recipes" / "gpt_baseline.yaml")
SHORT = ["--trainer.max_steps=3", "--trainer.val_check_interval=3", "--trainer.limit_val_batches=1",
         "--trainer.log_every_n_steps=1"]


# MLflow's SystemMetricsMonitor names (psutil): checked, not guessed.
SYSTEM_METRICS = {"system/cpu_utilization_percentage", "system/system_memory_usage_megabytes"}
FAST_SYSTEM_METRICS = ["--trainer.logger.init_args.system_metrics_interval=0.2"]  # samples within a short fit


def artifact_text(client, run_id: str, path: str) -> str:
    """Through the client's own tracking URI (``mlflow.artifacts`` would use the process-wide one)."""
    with tempfile.TemporaryDirectory() as tmp:
        return Path(client.download_artifacts(run_id, path, tmp)).read_text()


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
    (data,) = run.inputs.dataset_inputs  # the data, by digest (lit/tracking/dataset_input.py)
    assert data.dataset.digest == tags["arch_lab.data.digest"] and "val/bpb" in run.data.metrics
    config = artifact_text(client, run.info.run_id, "config.yaml")
    assert "class_path: lit.language_model.LanguageModel" in config and "d_model: 32" in config


def test_fit_logs_to_sqlite_by_default(workdir, capsys):
    main(["fit", "--config", BASELINE, *TINY_LM, *SHORT])
    assert (workdir / "mlflow.db").is_file()
    client, run = only_run("sqlite:///mlflow.db")
    assert_complete_run(client, run)
    # Where to look, in one click: the run's page in the model-training view, and how to serve a sqlite store.
    address = (f"http://127.0.0.1:5000/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}"
               "?workflowType=machine_learning")
    assert f"{address} (serve the store first: mlflow ui --backend-store-uri sqlite:///{workdir}/mlflow.db)" \
        in capsys.readouterr().out
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


@pytest.fixture
def mlflow_server(tmp_path):
    server = MlflowServer(tmp_path).start()
    yield server.url
    server.stop()


def test_fit_logs_to_a_real_mlflow_server(workdir, mlflow_server, capsys):
    main(["fit", "--config", BASELINE, *TINY_LM, *SHORT, f"--trainer.logger.init_args.tracking_uri={mlflow_server}"])
    assert not (workdir / "mlflow.db").exists()
    client, run = only_run(mlflow_server)
    assert_complete_run(client, run)
    # A server serves its own UI: the address is on it, with nothing to start.
    address = f"{mlflow_server}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}"
    assert f"in MLflow: {address}?workflowType=machine_learning\n" in capsys.readouterr().out


def steps(client, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, key))


def artifact_files(client, run_id: str, folder: str) -> set[str]:
    return {a.path for a in client.list_artifacts(run_id, folder)}


def test_resume_continues_the_same_run(workdir):
    uri = f"sqlite:///{workdir}/mlflow.db"  # MLflow caches a store per URI: a relative one is an earlier test's
    main(["fit", "--config", BASELINE, *TINY_LM, *SHORT, *FAST_SYSTEM_METRICS,
          "--trainer.logger.init_args.log_model=all"])
    client, run = only_run(uri)
    assert_complete_run(client, run)
    assert SYSTEM_METRICS <= set(run.data.metrics)
    assert steps(client, run.info.run_id, "train/loss") == [0, 1, 2]  # every queued metric was stored
    last = artifact_files(client, run.info.run_id, "last")
    assert {"last/last.ckpt", "last/metadata.yaml", "last/aliases.txt"} <= last
    folder = workdir / "runs" / run.info.experiment_id / run.info.run_id / "checkpoints"
    assert checkpoint_run(folder / "last.ckpt") == {"run_id": run.info.run_id, "experiment_id": run.info.experiment_id,
                                                     "tracking_uri": uri}
    system_steps = steps(client, run.info.run_id, "system/cpu_utilization_percentage")

    main(["fit", "--config", BASELINE, *TINY_LM, *SHORT, *FAST_SYSTEM_METRICS, "--trainer.max_steps=6",
          "--ckpt_path", str(folder / "last.ckpt")])
    client, resumed = only_run(uri)
    assert resumed.info.run_id == run.info.run_id and resumed.info.status == "FINISHED"
    assert steps(client, run.info.run_id, "train/loss") == [0, 1, 2, 3, 4, 5]
    # Reopened as RUNNING (MLflow's monitor stops at a finished run) and numbered on from the first fit.
    resumed_system = steps(client, run.info.run_id, "system/cpu_utilization_percentage")
    assert len(resumed_system) > len(system_steps) and len(set(resumed_system)) == len(resumed_system)
    assert (folder / "epoch=0-step=6.ckpt").is_file()  # the same checkpoint folder
    # MLflow params cannot change: the run keeps the first launch's, and gets this launch's config beside.
    assert resumed.data.params["trainer.max_steps"] == "3"
    config = artifact_text(client, resumed.info.run_id, "config.resume-1.yaml")
    assert "max_steps: 6" in config


def test_a_checkpoint_run_missing_from_the_store_starts_a_new_run(workdir, caplog):
    logger = MLflowLogger(tracking_uri=f"sqlite:///{workdir}/here.db")
    logger.continue_run("0" * 32, "old/last.ckpt", logged_to="http://elsewhere:5000")
    with caplog.at_level("WARNING", logger="lit.tracking"):
        run_id = logger.run_id
    assert run_id != "0" * 32 and mlflow.MlflowClient(f"sqlite:///{workdir}/here.db").get_run(run_id)
    assert [r.getMessage() for r in caplog.records if r.name == "lit.tracking"] == [
        f"MLflow run {'0' * 32} of checkpoint old/last.ckpt is not in sqlite:///{workdir}/here.db "
        "(it was logged to http://elsewhere:5000); logging to a new run"]


def test_an_explicit_run_id_wins_over_the_checkpoint_and_must_exist(workdir):
    uri = f"sqlite:///{workdir}/here.db"
    client = mlflow.MlflowClient(uri)
    given = client.create_run(client.create_experiment("given")).info.run_id
    client.set_terminated(given)
    logger = MLflowLogger(tracking_uri=uri, run_id=given)
    logger.continue_run("f" * 32, "old/last.ckpt")
    assert logger.run_id == given and logger.continued
    # Training again: MLflow's system-metrics thread would stop at once on a FINISHED run.
    assert client.get_run(given).info.status == "RUNNING"
    with pytest.raises(UserInputError, match=f"MLflow run {'e' * 32} does not exist in {uri}"):
        _ = MLflowLogger(tracking_uri=uri, run_id="e" * 32).run_id


def test_asynchronous_metrics_are_all_stored_before_the_run_ends(workdir, monkeypatch):
    # MLflow's queue then holds every batch for a second: whatever is not drained when the run is
    # terminated would be missing (MLflow's set_terminated drains it; this guards that we rely on it).
    monkeypatch.setenv("MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS", "1")
    logger = MLflowLogger(tracking_uri=f"sqlite:///{workdir}/here.db")
    for step in range(300):
        logger.log_metrics({"train/loss": 1.0 / (step + 1)}, step)
    logger.finalize("success")
    client = mlflow.MlflowClient(f"sqlite:///{workdir}/here.db")
    assert client.get_run(logger.run_id).info.status == "FINISHED"
    assert steps(client, logger.run_id, "train/loss") == list(range(300))


class FailsAtStep(L.LightningModule):
    def __init__(self, step: int):
        super().__init__()
        self.layer, self.fail_at = torch.nn.Linear(4, 1), step

    def training_step(self, batch, batch_idx):
        time.sleep(0.1)  # long enough for system-metric samples before the failure
        if batch_idx == self.fail_at:
            raise RuntimeError("boom")
        return self.layer(batch[0]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 4)), batch_size=4)


def test_a_failed_fit_stops_the_system_metrics_and_marks_the_run_failed(workdir):
    logger = MLflowLogger(tracking_uri=f"sqlite:///{workdir}/here.db", system_metrics_interval=0.1)
    callback = MLflowRun()
    trainer = L.Trainer(accelerator="cpu", max_steps=10, logger=logger, callbacks=[callback],
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit(FailsAtStep(5))
    assert callback._monitor is None
    assert not any(t.name == "SystemMetricsMonitor" and t.is_alive() for t in threading.enumerate())
    client = mlflow.MlflowClient(f"sqlite:///{workdir}/here.db")
    run = client.get_run(logger.run_id)
    assert run.info.status == "FAILED" and SYSTEM_METRICS <= set(run.data.metrics)


def test_system_metrics_interval_must_be_positive():
    with pytest.raises(UserInputError, match="system_metrics_interval must be a positive number of seconds"):
        MLflowLogger(system_metrics_interval=0)
