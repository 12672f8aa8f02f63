"""Lightning callbacks that act on the model from outside (no architecture special cases)."""

from lit.callbacks.unit_norm import RenormalizeUnitNormWeights, has_unit_norm_weights

__all__ = ["RenormalizeUnitNormWeights", "has_unit_norm_weights"]
