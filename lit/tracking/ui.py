"""Where a user looks at their runs: the MLflow UI address of an experiment or a run, in the model-training view.

MLflow 3.17's UI opens on its GenAI switch whatever the experiment's tag says (docs/mlflow-ui.md); an address with
``?workflowType=machine_learning`` lands in the model-training view (runs, charts, the sweep's tree) in one
click. A tracking server (``http(s)://``) serves its own UI at its address; a sqlite or file store has no server,
so the line also says how to serve it on the address it prints.
"""

from __future__ import annotations

LOCAL_UI = "http://127.0.0.1:5000"  # where `mlflow ui` serves by default
MODEL_TRAINING_VIEW = "workflowType=machine_learning"


def is_served(tracking_uri: str) -> bool:
    return tracking_uri.startswith(("http://", "https://"))


def ui_address(tracking_uri: str, experiment_id: str, run_id: str | None = None) -> str:
    """The UI address of an experiment (or of one of its runs) in the model-training view."""
    base = tracking_uri.rstrip("/") if is_served(tracking_uri) else LOCAL_UI
    page = f"#/experiments/{experiment_id}" + (f"/runs/{run_id}" if run_id else "")
    return f"{base}/{page}?{MODEL_TRAINING_VIEW}"


def where_to_look(tracking_uri: str, experiment_id: str, run_id: str | None = None) -> str:
    """One line for the end of a command: the address, and for a store without a server how to serve it."""
    address = ui_address(tracking_uri, experiment_id, run_id)
    if is_served(tracking_uri):
        return f"in MLflow: {address}"
    return f"in MLflow: {address} (serve the store first: mlflow ui --backend-store-uri {tracking_uri})"
