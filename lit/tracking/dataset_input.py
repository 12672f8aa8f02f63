"""The run's data as an MLflow dataset input (``run.inputs``) plus a tag with its digest, which ``compare``
reads to refuse pairing runs that saw different data. The DataModule describes its data
(``dataset_record()``, lit/data/fingerprint.py); one without that method logs nothing here."""

from __future__ import annotations

import json
import time

DATA_DIGEST_TAG = "arch_lab.data.digest"
# MLflow stores a dataset once per experiment: it looks for the dataset, then inserts it if absent. Two runs starting
# at once on the same data (a sweep's parallel children, ranks of separate jobs) can both find it absent; the second
# insert then fails on the table's unique key ("UNIQUE constraint failed: datasets.experiment_id, datasets.name,
# datasets.digest", seen in a 2-slot sweep) and its whole fit with it. The call is idempotent (an input already linked
# is skipped), so it is tried again, and the next look finds the other run's row.
ATTEMPTS = 4


def log_dataset(client, run_id: str, datamodule) -> dict | None:
    from mlflow.entities import Dataset, DatasetInput, InputTag, RunTag

    describe = getattr(datamodule, "dataset_record", None)
    if describe is None:
        return None
    record = describe()
    dataset = Dataset(name=record["name"], digest=record["digest"], source_type=record["source_type"],
                      source=json.dumps({"path": record["source"]}), profile=json.dumps(record["profile"]))
    inputs = [DatasetInput(dataset, tags=[InputTag("mlflow.data.context", "training")])]
    for attempt in range(ATTEMPTS):
        try:
            client.log_inputs(run_id, datasets=inputs)
            break
        except Exception:  # an MlflowException from a store, or a server's error passed on by the REST client
            if attempt == ATTEMPTS - 1:
                raise
            time.sleep(0.05 * 2**attempt)
    client.log_batch(run_id, tags=[RunTag(DATA_DIGEST_TAG, record["digest"])])
    return record
