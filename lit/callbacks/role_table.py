"""Logs the run's parameter roles once, at the start of a fit: how many tensors and numbers each role holds.

What each parameter is (``arch_plugins.declarations.parameter_roles``) decides its optimizer group, weight decay
and, under a parametrization, its learning-rate and init rules; the table makes that visible per run. Printed
on the console and stored as the MLflow artifact ``roles.json``. Nothing runs after ``on_fit_start``.
"""

from __future__ import annotations

import lightning as L
from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only, rank_zero_warn

from arch_plugins.declarations import UNDECLARED, format_role_table, role_table

ARTIFACT = "roles.json"


class LogRoleTable(L.Callback):
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._log(trainer, pl_module)

    @rank_zero_only
    def _log(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Not strict: a third-party plugin that predates roles still trains (its parameters show as undeclared).
        rows = role_table(pl_module, strict=False)
        rank_zero_info("Parameter roles:\n" + format_role_table(rows))
        if any(r["role"] == UNDECLARED for r in rows):
            rank_zero_warn("some parameters declare no role (listed as 'undeclared'): their modules should call "
                           "arch_plugins.declarations.declare_role (docs/plugins/declarations.md)")
        for logger in trainer.loggers:
            if isinstance(logger, MLFlowLogger):
                try:
                    logger.experiment.log_dict(logger.run_id, {"roles": rows}, ARTIFACT)
                except Exception as exc:  # an unreachable store must not stop training; the console has the table
                    rank_zero_warn(f"could not store {ARTIFACT} in MLflow run {logger.run_id}: {exc}")
