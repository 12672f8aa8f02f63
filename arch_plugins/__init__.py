"""Transformer components as plugins: the registry, the interfaces, and the built-in components.

Pure PyTorch, no Lightning. Importing this package imports no plugin: plugins load when selected.
"""

from arch_plugins.interfaces import (
    NormStrategy,
    ProjectionType,
    ResidualHistory,
    ResidualMerge,
    ResidualStream,
    ResidualType,
    Role,
    Site,
    StackInfo,
)
from arch_plugins.registry import PluginError, create, load, names

__all__ = [
    "NormStrategy", "ProjectionType", "ResidualType", "ResidualMerge", "ResidualStream", "ResidualHistory",
    "Role", "Site", "StackInfo", "PluginError", "create", "load", "names",
]
