"""The run's data as an MLflow dataset input (``run.inputs``) plus a tag with its digest, which ``compare``
reads to refuse pairing runs that saw different data. The DataModule describes its data
(``dataset_record()``, lit/data/fingerprint.py); one without that method logs nothing here."""

from __future__ import annotations

import json

DATA_DIGEST_TAG = "arch_lab.data.digest"


def log_dataset(client, run_id: str, datamodule) -> dict | None:
    from mlflow.entities import Dataset, DatasetInput, InputTag, RunTag

    describe = getattr(datamodule, "dataset_record", None)
    if describe is None:
        return None
    record = describe()
    dataset = Dataset(name=record["name"], digest=record["digest"], source_type=record["source_type"],
                      source=json.dumps({"path": record["source"]}), profile=json.dumps(record["profile"]))
    client.log_inputs(run_id, datasets=[DatasetInput(dataset, tags=[InputTag("mlflow.data.context", "training")])])
    client.log_batch(run_id, tags=[RunTag(DATA_DIGEST_TAG, record["digest"])])
    return record
