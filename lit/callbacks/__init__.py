"""Lightning callbacks that act on the model or the run from outside (no architecture special cases)."""

from lit.callbacks.mlflow_run import MLflowRun, continue_checkpoint_run
from lit.callbacks.non_finite import NonFiniteLossError, StopOnNonFiniteLoss
from lit.callbacks.role_table import LogRoleTable
from lit.callbacks.training_progress import ReportTrainingProgress
from lit.callbacks.unit_norm import RenormalizeUnitNormWeights, has_unit_norm_weights

__all__ = ["LogRoleTable", "MLflowRun", "NonFiniteLossError", "RenormalizeUnitNormWeights", "ReportTrainingProgress",
           "StopOnNonFiniteLoss", "continue_checkpoint_run", "has_unit_norm_weights"]
