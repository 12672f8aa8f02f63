"""Lightning callbacks that act on the model or the run from outside (no architecture special cases).

``MLflowRun`` lives with the rest of tracking (``lit/tracking/run.py``); it is named here too because
recipes and stored configs name ``lit.callbacks.MLflowRun``.
"""

from lit.callbacks.non_finite import NonFiniteLossError, StopOnNonFiniteLoss
from lit.callbacks.role_table import LogRoleTable
from lit.callbacks.training_progress import ReportTrainingProgress
from lit.callbacks.unit_norm import RenormalizeUnitNormWeights, has_unit_norm_weights
from lit.tracking.run import MLflowRun, continue_checkpoint_run

__all__ = ["LogRoleTable", "MLflowRun", "NonFiniteLossError", "RenormalizeUnitNormWeights", "ReportTrainingProgress",
           "StopOnNonFiniteLoss", "continue_checkpoint_run", "has_unit_norm_weights"]
