"""Parameter roles and the rows of fused matrices: declared in ``arch_plugins.declarations`` (this path keeps old
imports working)."""

from arch_plugins.declarations import declare_dense_rows, dense_role, dense_weight

__all__ = ["declare_dense_rows", "dense_role", "dense_weight"]
