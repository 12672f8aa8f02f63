"""DataModules. Embedded small real data by default; real scale through token shards and image folders.

The DataModules are imported when first named (``lit.data.TextDataModule``), so that the tools in this package
that need no Lightning (``prepare-data``, ``train-tokenizer``) start without importing it.
"""

from importlib import import_module

_MODULES = {"DigitsDataModule": "lit.data.digits", "ImageFolderDataModule": "lit.data.imagenet",
            "TextDataModule": "lit.data.text"}

__all__ = list(_MODULES)


def __getattr__(name: str):
    if name in _MODULES:
        return getattr(import_module(_MODULES[name]), name)
    raise AttributeError(f"module 'lit.data' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
