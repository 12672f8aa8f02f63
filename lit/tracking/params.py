"""Params of a run: settings flattened to ``a.b.c`` keys, logged once (MLflow params cannot change), and what
a continued run would have changed, said in one line."""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Mapping
from dataclasses import asdict, is_dataclass
from typing import TYPE_CHECKING, Any

from lit.tracking.batches import MAX_PARAM_LENGTH, MAX_PARAMS_PER_BATCH, batches

if TYPE_CHECKING:
    from mlflow import MlflowClient


def flatten(settings: Mapping | Namespace | Any, delimiter: str = ".", prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; dataclasses and namespaces are opened like mappings, an empty
    mapping and any other value (a list included) is kept as the value of its key."""
    out: dict[str, Any] = {}
    for k, v in _opened(settings).items():
        key = f"{prefix}{delimiter}{k}" if prefix else str(k)
        if isinstance(_opened(v), Mapping) and _opened(v):
            out.update(flatten(v, delimiter, key))
        else:
            out[key] = v
    return out


def _opened(value: Any) -> Any:
    if isinstance(value, Namespace):
        return vars(value)
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    return value


def log_params(client: MlflowClient, run_id: str, params: dict[str, Any],
               synchronous: bool = True) -> dict[str, tuple[str, str]]:
    """Log the params the run does not have yet (values up to MLflow's 6000 characters).

    MLflow params cannot change, so a continued run keeps its first values. Returns
    ``{key: (value in the run, value now)}`` for those that differ.
    """
    from mlflow.entities import Param

    existing = client.get_run(run_id).data.params
    values = {k: str(v)[:MAX_PARAM_LENGTH] for k, v in params.items()}
    new = [Param(k, v) for k, v in values.items() if k not in existing]
    for part in batches(new, MAX_PARAMS_PER_BATCH):
        client.log_batch(run_id, params=part, synchronous=synchronous)
    return {k: (existing[k], v) for k, v in values.items() if k in existing and existing[k] != v}


def describe_changes(changed: dict[str, tuple[str, str]], limit: int = 5) -> str:
    shown = ", ".join(f"{k} ({old[:40]} -> {new[:40]})" for k, (old, new) in list(changed.items())[:limit])
    return shown + (f" and {len(changed) - limit} more" if len(changed) > limit else "")
