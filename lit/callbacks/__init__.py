"""Lightning callbacks that act on the model from outside (no architecture special cases)."""

from lit.callbacks.non_finite import NonFiniteLossError, StopOnNonFiniteLoss
from lit.callbacks.unit_norm import RenormalizeUnitNormWeights, has_unit_norm_weights

__all__ = ["NonFiniteLossError", "StopOnNonFiniteLoss", "RenormalizeUnitNormWeights", "has_unit_norm_weights"]
