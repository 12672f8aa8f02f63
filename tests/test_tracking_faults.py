"""A tracking server that is down before training, or goes away during it: one line and a choice before anything
is built, no metric lost in between (a real `mlflow server` on 127.0.0.1, stopped and started during a run)."""

from __future__ import annotations

import json
import time

import mlflow
import pytest
from mlflow.entities import Metric

from lit.cli import main
from lit.tracking.outbox import MetricOutbox
from lit.tracking.sync import main as sync
from tests import fault_injection
from tests.conftest import REPO, TINY_LM, free_port
from tests.mlflow_server import MlflowServer

BASELINE = str(REPO / "recipes" / "gpt_baseline.yaml")
NO_VALIDATION = ["--trainer.val_check_interval=null", "--trainer.limit_val_batches=0", "--trainer.log_every_n_steps=1",
                 "--trainer.logger.init_args.system_metrics=false"]


def fit(*args: str) -> None:
    main(["fit", "--config", BASELINE, *TINY_LM, *NO_VALIDATION, *args])


def steps(client, run_id: str, key: str = "train/loss") -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, key))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = MlflowServer(tmp_path_factory.mktemp("mlflow-server")).start()
    fault_injection.SERVERS["mlflow"] = server
    yield server
    fault_injection.SERVERS.pop("mlflow", None)
    server.stop()


def test_a_server_down_before_training_is_one_line_at_once(workdir, capsys):
    dead = f"http://127.0.0.1:{free_port()}"
    start = time.time()
    with pytest.raises(SystemExit) as exit_info:
        fit("--trainer.max_steps=3", f"--trainer.logger.init_args.tracking_uri={dead}")
    assert exit_info.value.code == 2
    assert time.time() - start < 60  # it waited about four minutes in MLflow's retries
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, errors
    assert f"the MLflow tracking server {dead} is not reachable" in errors[0]
    assert "--trainer.logger.init_args.if_unreachable=local" in errors[0]
    assert not (workdir / "runs").exists()  # nothing was trained


@pytest.mark.slow  # a new local sqlite store costs ~5-20 s of MLflow migrations on 2 busy cores
def test_falling_back_to_the_local_store_and_copying_the_run_to_the_server_later(workdir, server, caplog):
    dead = f"http://127.0.0.1:{free_port()}"
    with caplog.at_level("WARNING", logger="lit.tracking"):
        fit("--trainer.max_steps=3", f"--trainer.logger.init_args.tracking_uri={dead}",
            "--trainer.logger.init_args.if_unreachable=local", "--trainer.logger.init_args.experiment_name=fallback")
    local = f"sqlite:///{workdir}/mlflow.db"
    run = mlflow.MlflowClient(local).search_runs([mlflow.MlflowClient(local).get_experiment_by_name("fallback")
                                                  .experiment_id])[0]
    warnings = [r.getMessage() for r in caplog.records if r.name == "lit.tracking"]
    assert any(f"{dead} is not reachable" in w and f"logging to the local store {local}" in w for w in warnings)
    command = f"python cli.py sync run {run.info.run_id} --from {local} --to {dead}"
    assert any(command in w for w in warnings), warnings

    assert sync(["run", run.info.run_id, "--from", local, "--to", server.url]) == 0
    client = mlflow.MlflowClient(server.url)
    copy = client.search_runs([client.get_experiment_by_name("fallback").experiment_id])[0]
    assert copy.info.status == "FINISHED" and steps(client, copy.info.run_id) == [0, 1, 2]
    assert copy.data.params == run.data.params and copy.data.params["trainer.max_steps"] == "3"
    assert "config.yaml" in {a.path for a in client.list_artifacts(copy.info.run_id)}
    assert sync(["run", run.info.run_id, "--from", local, "--to", server.url]) == 2  # copied once only


def test_the_server_stopped_and_started_during_a_run_loses_no_metric(workdir, server, caplog):
    # Down from step 3; at step 5, once the outbox has failed to send and kept the metrics on disk, started again.
    # It takes seconds to be up, so training goes on while it is away, and the end of training waits for it.
    outage = "{class_path: tests.fault_injection.ServerOutage, init_args: {stop_at: 3, start_at: 5}}"
    fault_injection.OBSERVED.clear()
    with caplog.at_level("WARNING", logger="lit.tracking.outbox"):
        fit("--trainer.max_steps=12", f"--trainer.logger.init_args.tracking_uri={server.url}",
            "--trainer.logger.init_args.experiment_name=outage", "--trainer.logger.init_args.flush_timeout=180",
            f"--trainer.callbacks=[{outage}]")
    assert fault_injection.OBSERVED["journal_during_outage"]  # kept on disk while the server was away
    messages = [r.getMessage() for r in caplog.records if r.name == "lit.tracking.outbox"]
    assert any("cannot take metrics now" in m for m in messages) and any("is back" in m for m in messages)
    client = mlflow.MlflowClient(server.url)
    run = client.search_runs([client.get_experiment_by_name("outage").experiment_id])[0]
    assert run.info.status == "FINISHED"
    assert steps(client, run.info.run_id) == list(range(12))
    assert steps(client, run.info.run_id, "train/lr") == list(range(12))
    assert not list(workdir.glob("runs/*/*/unsent_metrics.jsonl"))


def test_metrics_a_store_never_took_are_kept_and_sent_later(workdir, server, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    store = server.url  # where the run really is; the outbox sends to a port where nothing listens
    client = mlflow.MlflowClient(store)
    run_id = client.create_run(client.create_experiment("kept")).info.run_id
    journal = workdir / "unsent_metrics.jsonl"
    outbox = MetricOutbox(mlflow.MlflowClient(f"http://127.0.0.1:{free_port()}"), run_id, journal, retry_interval=0.1)
    outbox.put([Metric("train/loss", 1.0 / (s + 1), 1000 + s, s) for s in range(1500)])
    assert outbox.close(timeout=0.5, status="FINISHED") == 1500
    header = json.loads(journal.read_text().splitlines()[0])
    assert header["run_id"] == run_id and header["status"] == "FINISHED"

    assert sync(["send", str(journal), "--to", store]) == 0
    assert steps(client, run_id) == list(range(1500)) and client.get_run(run_id).info.status == "FINISHED"
    assert not journal.exists()
