"""Learned scalars worth watching: declared in ``arch_plugins.declarations`` (this path keeps old imports working)."""

from arch_plugins.declarations import ScalarFn, declare_diagnostic, declared_diagnostics, has_diagnostics

__all__ = ["ScalarFn", "declare_diagnostic", "declared_diagnostics", "has_diagnostics"]
