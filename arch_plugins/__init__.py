"""Transformer components as plugins: the registry, the interfaces, and the built-in components.

Pure PyTorch, no Lightning. Importing this package imports no plugin (plugins load when selected) and not
even torch: the names below are resolved on first use, so listing plugins (``arch_plugins.registry``,
``arch_plugins.catalogue``) reads package metadata and source files only and answers at once.
"""

from importlib import import_module

_EXPORTS = {
    **{name: "arch_plugins.interfaces" for name in (
        "NormStrategy", "ProjectionType", "ResidualType", "ResidualMerge", "ResidualStream", "ResidualHistory",
        "Role", "Site", "StackInfo")},
    **{name: "arch_plugins.registry" for name in ("PluginError", "create", "load", "names")},
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'arch_plugins' has no attribute {name!r}")
