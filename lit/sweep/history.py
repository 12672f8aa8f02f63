"""A sweep's course, kept as a history that is never overwritten: one artifact per event under the parent run.

``protocol.json`` says what the sweep is now (``--add_seeds`` rewrites its seed list); these say how it got there,
so a report can tell a planned look from an unplanned one:

    looks/look_<k>.json            a sequential sweep's look k: its seeds, each comparison's test, boundary and
                                   decision (``lit/statistics/sequential.py``, ``SequentialResult.look_record``)
    extensions/extension_<j>.json  ``--add_seeds`` outside a sequential plan: from how many seeds to how many, when

A file is written once: a look or an extension already recorded is never written again (MLflow would replace
it silently), so rerunning a command after an interruption leaves the record as it was.
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from pathlib import Path

from lit.tracking.downloads import quiet_downloads

LOOKS_DIR, EXTENSIONS_DIR = "looks", "extensions"


def _records(client, run_id: str, folder: str, stem: str) -> list[dict]:
    pattern = re.compile(rf"{stem}_(\d+)\.json$")
    found = sorted((int(m.group(1)), a.path) for a in client.list_artifacts(run_id, folder)
                   if (m := pattern.search(a.path)))
    records = []
    with tempfile.TemporaryDirectory() as tmp, quiet_downloads():
        for _, path in found:
            records.append(json.loads(Path(client.download_artifacts(run_id, path, tmp)).read_text()))
    return records


def _write_once(client, run_id: str, folder: str, stem: str, index: int, record: dict) -> bool:
    """Write ``<folder>/<stem>_<index>.json`` unless it exists; returns whether it was written."""
    name = f"{stem}_{index}.json"
    if any(a.path.endswith(f"/{name}") for a in client.list_artifacts(run_id, folder)):
        return False
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_text(json.dumps({**record, "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}, indent=1))
        client.log_artifact(run_id, str(path), folder)
    return True


def read_looks(client, run_id: str) -> list[dict]:
    """The looks recorded so far, in order (look 1 first)."""
    return _records(client, run_id, LOOKS_DIR, "look")


def write_look(client, run_id: str, record: dict) -> bool:
    return _write_once(client, run_id, LOOKS_DIR, "look", int(record["look"]), record)


def read_extensions(client, run_id: str) -> list[dict]:
    """The ``--add_seeds`` extensions recorded, in order: ``{"index", "from_seeds", "to_seeds", ...}``."""
    return _records(client, run_id, EXTENSIONS_DIR, "extension")


def write_extension(client, run_id: str, from_seeds: int, to_seeds: int) -> dict:
    """Record that the sweep grew from ``from_seeds`` to ``to_seeds`` paired seeds outside a sequential plan."""
    index = len(read_extensions(client, run_id)) + 1
    record = {"index": index, "from_seeds": from_seeds, "to_seeds": to_seeds,
              "meaning": "an unplanned interim look: the verdicts read at from_seeds were a look at the same family"}
    _write_once(client, run_id, EXTENSIONS_DIR, "extension", index, record)
    return record
