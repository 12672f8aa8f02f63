"""Diagnostics of a training run: residual-stream scale, gradient/weight/update norms, attention entropy,
plugins' learned scalars and loss spikes, logged as ``diag/*`` MLflow metrics (``Diagnostics``)."""

from lit.diagnostics.callback import Diagnostics
from lit.diagnostics.config import GROUPS, DiagnosticsConfig

__all__ = ["GROUPS", "Diagnostics", "DiagnosticsConfig"]
