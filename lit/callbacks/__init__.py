"""Lightning callbacks that act on the model from outside (no architecture special cases)."""

from lit.callbacks.mlflow_run import MLflowRun, continue_checkpoint_run
from lit.callbacks.unit_norm import RenormalizeUnitNormWeights, has_unit_norm_weights

__all__ = ["MLflowRun", "RenormalizeUnitNormWeights", "continue_checkpoint_run", "has_unit_norm_weights"]
