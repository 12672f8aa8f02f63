"""Provenance: each run's data as an MLflow dataset input with a digest of meta.json, the shard sizes and the
tokenizer; ``compare`` refuses to pair runs whose digests differ."""

from __future__ import annotations

import json
import shutil

import pytest

from lit.data.prepare import prepare
from lit.data.text import TextDataModule
from lit.data.tokenizer_training import train_tokenizer
from lit.tracking.dataset_input import DATA_DIGEST_TAG, log_dataset
from tests.test_compare import log_child, log_parent, protocol_spec


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    from mlflow import MlflowClient

    root = tmp_path_factory.mktemp("provenance")
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    client.experiment_id = client.create_experiment("data", artifact_location=str(root / "artifacts"))
    client.uri = f"sqlite:///{root / 'mlflow.db'}"
    return client


def make_shards(root):
    docs = [f"document {i}: " + "to be or not to be, that is the question. " * (i % 5 + 1) for i in range(30)]
    (root / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    train_tokenizer([str(root / "docs.jsonl")], str(root / "tok.json"), vocab_size=280)
    prepare([str(root / "docs.jsonl")], str(root / "tok.json"), str(root / "shards"), val_fraction=0.2,
            test_fraction=0.2, seed=0, processes=1)
    return root / "shards"


def test_the_run_records_its_data_with_a_digest(client, tmp_path):
    shards = make_shards(tmp_path)
    run = client.create_run(client.experiment_id)
    record = log_dataset(client, run.info.run_id, TextDataModule(shards_dir=str(shards), block_size=8))
    logged = client.get_run(run.info.run_id)
    (data,) = logged.inputs.dataset_inputs
    meta = json.loads((shards / "meta.json").read_text())
    assert data.dataset.digest == record["digest"] == logged.data.tags[DATA_DIGEST_TAG]
    assert json.loads(data.dataset.profile)["tokenizer_sha256"] == meta["tokenizer_sha256"]
    assert json.loads(data.dataset.source)["path"] == str(shards.resolve())

    moved = tmp_path / "moved"
    shutil.copytree(shards, moved)
    assert TextDataModule(shards_dir=str(moved)).dataset_record()["digest"] == record["digest"]  # same data
    with open(next(moved.glob("*train*.bin")), "ab") as f:
        f.write(b"\0\0")
    assert TextDataModule(shards_dir=str(moved)).dataset_record()["digest"] != record["digest"]
    char = TextDataModule(block_size=8).dataset_record()
    assert char["digest"] == TextDataModule(block_size=16).dataset_record()["digest"] != record["digest"]


def test_compare_refuses_to_pair_runs_that_saw_different_data(client, tmp_path, capsys):
    from lit.compare.command import main

    def sweep(sweep_id: str, digests: dict[str, str]) -> str:
        parent = log_parent(client, client.experiment_id, sweep_id,
                            protocol_spec(sweep_id, list(digests), [0, 1], tune=None))
        for variant, digest in digests.items():
            for seed in (0, 1):
                log_child(client, client.experiment_id, parent, sweep_id, variant, seed,
                          {"val/loss": [(10, 3.0 + seed + 0.1 * len(variant))]}, tags={DATA_DIGEST_TAG: digest})
        return parent

    same = sweep("aaaa00000001", {"base": "d1", "other": "d1"})
    assert main(["--sweep", same, "--tracking_uri", client.uri, "--out", str(tmp_path / "same")]) == 0
    differ = sweep("aaaa00000002", {"base": "d1", "other": "d2"})
    capsys.readouterr()
    code = main(["--sweep", differ, "--tracking_uri", client.uri, "--out", str(tmp_path / "differ")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("error:")
    assert "saw different data" in err and "d1" in err and "d2" in err


def test_a_dataset_another_run_inserted_meanwhile_is_linked_not_a_failed_fit(client, monkeypatch):
    """The race of two runs starting at once on the same data: both look for the dataset, find none, and both insert
    it; the second insert fails on the unique key. Replayed here: the other run logs the dataset between our look and
    our insert (the first call fails as MLflow fails it), and our run must still end up linked to that dataset."""
    from mlflow.exceptions import MlflowException

    dm = TextDataModule(block_size=8)
    other, ours = (client.create_run(client.experiment_id) for _ in range(2))
    real, calls = client.log_inputs, []

    def racing(run_id, datasets=None, **kwargs):
        calls.append(run_id)
        if len(calls) == 1:
            real(other.info.run_id, datasets=datasets, **kwargs)  # the other run wins the race
            raise MlflowException("(sqlite3.IntegrityError) UNIQUE constraint failed: datasets.experiment_id, "
                                  "datasets.name, datasets.digest")
        return real(run_id, datasets=datasets, **kwargs)

    monkeypatch.setattr(client, "log_inputs", racing)
    record = log_dataset(client, ours.info.run_id, dm)
    assert calls == [ours.info.run_id] * 2
    logged = [client.get_run(r.info.run_id) for r in (other, ours)]
    assert [run.inputs.dataset_inputs[0].dataset.digest for run in logged] == [record["digest"]] * 2
    assert logged[1].data.tags[DATA_DIGEST_TAG] == record["digest"]


def test_a_store_that_keeps_failing_still_fails_the_run(client, monkeypatch):
    from mlflow.exceptions import MlflowException

    def broken(run_id, datasets=None, **kwargs):
        raise MlflowException("the store is gone")

    monkeypatch.setattr(client, "log_inputs", broken)
    monkeypatch.setattr("lit.tracking.dataset_input.time.sleep", lambda s: None)
    with pytest.raises(MlflowException, match="the store is gone"):
        log_dataset(client, client.create_run(client.experiment_id).info.run_id, TextDataModule(block_size=8))
