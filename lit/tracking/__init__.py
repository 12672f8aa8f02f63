"""Tracking: every training is an MLflow run, and nothing it logs is lost when the store goes away.

A researcher changing the model can ignore this package; it is where to look when a run is not where
it should be. The modules, in the order a training meets them:

- ``uri``: which store (``$MLFLOW_TRACKING_URI`` or ``sqlite:///mlflow.db``), and the creation lock that
  lets processes started together open a new sqlite store (``removed_lock``: its file is removed after use).
- ``reachability``: a server that does not answer is found before anything is built (one line), and
  the user chooses what then happens (``if_unreachable``: fail, or log locally and copy the run later).
- ``logger``: ``MLflowLogger``, Lightning's MLflow logger made to work on MLflow 3.x: asynchronous
  metrics, continued runs, sharded checkpoints as artifacts, experiments tagged as model training.
- ``run``: ``MLflowRun``, one run per training however many processes, continued on resume, with
  system metrics; ``continue_checkpoint_run``.
- ``config_log``: ``LogConfigToMLflow``, the resolved config as ``config.yaml`` and params, with the
  plugins and the git commit as tags.
- ``params``: flattening settings into params, logging them once.
- ``outbox``: metrics wait here until the store takes them; what it never took is kept in a file.
- ``checkpointed_metrics``: what the outbox has not sent travels in every checkpoint, so a SIGKILL loses
  no step the checkpoint holds; a resume logs it, and each step once.
- ``sync``: ``python cli.py sync``, sending that file later, or copying a run to another store.
- ``names``: the tags and the diagnostics metric names that writers and readers (``compare``) share.
- ``batches``: MLflow's limits per request.
- ``history``: the (key, step) pairs a run already has, so that what is logged again goes in once.

The public names below are imported on first use, so ``lit.tracking.names`` or ``lit.tracking.uri``
cost no Lightning import; ``lit.tracking.MLflowLogger``, the class path every recipe and every config
stored in a run names, keeps working.
"""

from __future__ import annotations

import importlib

# Public name -> the module of this package that defines it.
_PUBLIC = {
    "MLflowLogger": "logger", "warn": "logger", "checkpoints_to_log": "logger",
    "declare_training_experiment": "logger",
    "LogConfigToMLflow": "config_log", "provenance_tags": "config_log", "git_commit": "config_log",
    "MLflowRun": "run", "continue_checkpoint_run": "run", "checkpoint_run": "run", "mlflow_logger": "run",
    "MetricOutbox": "outbox",
    "log_params": "params", "describe_changes": "params", "flatten": "params",
    "DEFAULT_TRACKING_URI": "uri", "resolve_tracking_uri": "uri", "absolute_sqlite": "uri",
    "sqlite_creation_lock": "uri",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_PUBLIC[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
