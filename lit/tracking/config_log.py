"""The resolved config of a training, logged into its MLflow run (``config.yaml`` and params), with the
provenance a reader needs to trust it: the plugins the model is built from and the git commit."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import MLFlowLogger
from torch import nn

from lit.tracking.dataset_input import log_dataset
from lit.tracking.logger import warn
from lit.tracking.names import GIT_COMMIT, GIT_DIRTY, plugin_tag
from lit.tracking.params import describe_changes, flatten, log_params

# The code that runs, wherever the run is launched from: its commit is the run's provenance.
CODE_DIR = Path(__file__).resolve().parents[2]
NOT_PARAMS = ("config", "ckpt_path")  # where the settings came from, not settings


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
        tags[plugin_tag(spec.kind)] = spec.name
        tags[f"{plugin_tag(spec.kind)}.package"] = spec.origin
    commit = git_commit()
    if commit:
        tags[GIT_COMMIT] = commit[0]
        tags[GIT_DIRTY] = str(commit[1]).lower()
    return tags


class LogConfigToMLflow(SaveConfigCallback):
    """Logs the fully resolved config into each MLflow run: as ``config.yaml`` and as flattened params.

    Also tags the run with the plugins used and the git commit. Runs on rank 0 only (no collectives).
    A continued run (``fit --ckpt_path``) keeps its ``config.yaml`` and params; the new launch's config
    is logged beside it as ``config.resume-<n>.yaml``.
    """

    def __init__(self, parser, config, config_filename: str = "config.yaml", overwrite: bool = False,
                 multifile: bool = False, save_to_log_dir: bool = False):
        # A shared log_dir file collides between runs (Lightning #20184): the run is the place for it.
        super().__init__(parser, config, config_filename, overwrite, multifile, save_to_log_dir=False)

    def save_config(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        from mlflow.entities import RunTag

        for logger in trainer.loggers:
            if not isinstance(logger, MLFlowLogger):
                continue
            client, run_id = logger.experiment, logger.run_id
            stem, suffix = os.path.splitext(self.config_filename)
            earlier = [a.path for a in client.list_artifacts(run_id)
                       if a.path == self.config_filename or a.path.startswith(f"{stem}.resume-")]
            filename = f"{stem}.resume-{len(earlier)}{suffix}" if earlier else self.config_filename
            dumped = self.parser.dump(self.config, skip_none=False)
            client.log_text(run_id, dumped, filename)
            # Params from the dump, as config.yaml shows them: values linked from the data at
            # instantiation are left out there (the model's hyperparameters hold them).
            params = {k: v for k, v in flatten(yaml.safe_load(dumped)).items() if k not in NOT_PARAMS}
            changed = log_params(client, run_id, params)
            if changed:
                warn(f"MLflow run {run_id} continues with other settings than it has as params: "
                     f"{describe_changes(changed)}; this launch's config is {filename}")
            client.log_batch(run_id, tags=[RunTag(k, v) for k, v in provenance_tags(pl_module).items()])
            log_dataset(client, run_id, trainer.datamodule)  # run.inputs: what data, by digest
