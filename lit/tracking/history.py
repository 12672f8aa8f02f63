"""What a run's metric history already holds, as (key, step) pairs: a value logged again after a kill (a resume, a
journal sent later) goes in only where MLflow has none, so each step is in the history once."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mlflow import MlflowClient


def logged_steps(client: MlflowClient, run_id: str, keys: Iterable[str] = ()) -> set[tuple[str, int]]:
    """(key, step) of every value the run has of ``keys`` and of the metrics it already shows."""
    keys = set(client.get_run(run_id).data.metrics) | set(keys)
    return {(key, m.step) for key in sorted(keys) for m in client.get_metric_history(run_id, key)}
