"""MLflow as the default tracker, with the known crashes of MLFlowLogger + LightningCLI handled.

- A bare ``MLFlowLogger()`` falls back to the ``./mlruns`` file store, which MLflow >= 3.13 refuses:
  ``MLflowLogger`` defaults to ``sqlite:///mlflow.db`` (or ``MLFLOW_TRACKING_URI``, read when the
  logger is built, not when Lightning is imported).
- With a non-file URI, ``MLFlowLogger.save_dir`` is None, so LightningCLI's ``SaveConfigCallback``
  asserts and checkpoints land in a folder named after the experiment id. ``MLflowLogger`` keeps a
  local ``save_dir`` for checkpoints (``<save_dir>/<experiment_id>/<run_id>/checkpoints``) and
  ``LogConfigToMLflow`` writes the resolved config into the run instead of a shared file.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any, Literal

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import MLFlowLogger
from torch import nn

# The code that runs, wherever the run is launched from: its commit is the run's provenance.
CODE_DIR = Path(__file__).resolve().parent.parent
DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
MAX_PARAM_LENGTH = 6000  # MLflow's limit; Lightning's own log_hyperparams truncates to 250


class MLflowLogger(MLFlowLogger):
    """MLFlowLogger that works out of the box on MLflow 3.x, with run-specific checkpoint folders.

    Args:
        experiment_name: MLflow experiment.
        run_name: MLflow run name (default: MLflow picks one).
        tracking_uri: default ``$MLFLOW_TRACKING_URI`` or ``sqlite:///mlflow.db``; an
            ``http://host:port`` server works too.
        tags: extra run tags.
        save_dir: local folder for checkpoints, one subfolder per run.
        log_model: log checkpoints as artifacts (False, True at the end, or "all").
        run_id: continue an existing run.
        synchronous: MLflow's synchronous logging switch (None: MLflow's default).
    """

    def __init__(self, experiment_name: str = "arch-lab", run_name: str | None = None,
                 tracking_uri: str | None = None, tags: dict[str, Any] | None = None, save_dir: str = "runs",
                 log_model: Literal[True, False, "all"] = False, artifact_location: str | None = None,
                 run_id: str | None = None, synchronous: bool | None = None):
        tracking_uri = absolute_sqlite(tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI)
        super().__init__(experiment_name=experiment_name, run_name=run_name, tracking_uri=tracking_uri,
                         tags=tags, save_dir=save_dir, log_model=log_model,
                         artifact_location=artifact_location, run_id=run_id, synchronous=synchronous)
        self._local_dir = save_dir

    @property
    def save_dir(self) -> str:
        return self._local_dir


def absolute_sqlite(uri: str) -> str:
    """``sqlite:///mlflow.db`` -> ``sqlite:////abs/path/mlflow.db``: the launch folder is resolved once.

    MLflow caches one database engine per URI string, so a relative URI would keep writing to the
    first folder's database in a process that changes directory (notebooks, tests).
    """
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/") and ":memory:" not in uri:
        return prefix + str(Path(uri[len(prefix):]).resolve())
    return uri


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and v:
            out.update(_flatten(v, key))
        else:
            out[key] = v
    return out


def git_commit() -> tuple[str, bool] | None:
    """(commit, dirty) of the checkout the running code comes from, or None outside one."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                                check=True, cwd=CODE_DIR).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                text=True, timeout=5, check=True, cwd=CODE_DIR).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit, bool(status)


def provenance_tags(model: nn.Module) -> dict[str, str]:
    """The plugins ``model`` is built from (name, package, version) and the git commit, as MLflow tags."""
    tags = {}
    for spec in {s for m in model.modules() for s in getattr(m, "plugin_specs", ())}:
        tags[f"plugin.{spec.kind}"] = spec.name
        tags[f"plugin.{spec.kind}.package"] = spec.origin
    commit = git_commit()
    if commit:
        tags["mlflow.source.git.commit"] = commit[0]
        tags["git.dirty"] = str(commit[1]).lower()
    return tags


class LogConfigToMLflow(SaveConfigCallback):
    """Logs the fully resolved config into each MLflow run: as ``config.yaml`` and as flattened params.

    Also tags the run with the plugins used and the git commit. Runs on rank 0 only (no collectives).
    """

    def __init__(self, parser, config, config_filename: str = "config.yaml", overwrite: bool = False,
                 multifile: bool = False, save_to_log_dir: bool = False):
        # A shared log_dir file collides between runs (Lightning #20184): the run is the place for it.
        super().__init__(parser, config, config_filename, overwrite, multifile, save_to_log_dir=False)

    def save_config(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        from mlflow.entities import Param, RunTag

        for logger in trainer.loggers:
            if not isinstance(logger, MLFlowLogger):
                continue
            client, run_id = logger.experiment, logger.run_id
            client.log_text(run_id, self.parser.dump(self.config, skip_none=False), self.config_filename)
            params = [Param(k, str(v)[:MAX_PARAM_LENGTH]) for k, v in _flatten(self.config.as_dict()).items()
                      if k != "config"]  # the --config paths are not hyperparameters
            for i in range(0, len(params), 100):
                client.log_batch(run_id, params=params[i:i + 100])
            client.log_batch(run_id, tags=[RunTag(k, v) for k, v in provenance_tags(pl_module).items()])
