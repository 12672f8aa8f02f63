"""Logs the run's parameter roles once, at the start of a fit: how many tensors and numbers each role holds, and
which optimizer steps it at what learning rate (relative to the task's) and weight decay.

What each parameter is (``arch_plugins.declarations.parameter_roles``) decides its optimizer group, weight decay
and, under a parametrization, its learning-rate and init rules; the table makes that visible per run. Printed
on the console and stored as the MLflow artifact ``roles.json``. Nothing runs after ``on_fit_start``.
"""

from __future__ import annotations

import lightning as L
from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only, rank_zero_warn

from arch_plugins.declarations import UNDECLARED, format_role_table, role_table
from arch_plugins.optimizers.routing import optimizer_settings

ARTIFACT = "roles.json"


class LogRoleTable(L.Callback):
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._log(trainer, pl_module)

    @rank_zero_only
    def _log(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Not strict: a third-party plugin that predates roles still trains (its parameters show as undeclared).
        rows = role_table(pl_module, strict=False)
        if getattr(trainer, "optimizers", None):  # how the optimizer treats each role, as built
            settings = optimizer_settings(pl_module, trainer.optimizers[0])
            for row in rows:
                row.update(settings.get(row["role"], {}))
        rank_zero_info("Parameter roles:\n" + format_role_table(rows) + optimizer_lines(rows))
        if any(r["role"] == UNDECLARED for r in rows):
            rank_zero_warn("some parameters declare no role (listed as 'undeclared'): their modules should call "
                           "arch_plugins.declarations.declare_role (docs/plugins/declarations.md)")
        for logger in trainer.loggers:
            if isinstance(logger, MLFlowLogger):
                try:
                    logger.experiment.log_dict(logger.run_id, {"roles": rows}, ARTIFACT)
                except Exception as exc:  # an unreachable store must not stop training; the console has the table
                    rank_zero_warn(f"could not store {ARTIFACT} in MLflow run {logger.run_id}: {exc}")


def optimizer_lines(rows: list[dict]) -> str:
    """The optimizer's view of each role, under the role table."""
    lines = [f"{r['role']:<24} {r['optimizer']!s:<10} lr x{r['lr_ratio']!s:<14} wd {r['weight_decay']}"
             for r in rows if "optimizer" in r]
    return "\n\nOptimizer by role:\n" + "\n".join(lines) if lines else ""
