"""lucidrains' nGPT-pytorch (PyPI ``ngpt-pytorch``, import ``nGPT_pytorch``) as a peer, with its 0.2.16 bug fixed.

Its modules define ``__eq__`` without ``__hash__``, which makes them unhashable, and ``Module.parameters()``
(a set of modules seen) then raises ``TypeError: unhashable type``. Restoring identity hashing on those
classes is exactly what ``nn.Module`` would have had. ``import nGPT_pytorch.nGPT`` yields the class (the
package re-exports it under the module's name), so the modules are taken from ``sys.modules``.

Used by the nGPT equality test (tests/test_ngpt.py) and the throughput benchmark.
"""

from __future__ import annotations

import importlib
import sys

from torch import nn

_MODULES = ("nGPT_pytorch.nGPT", "nGPT_pytorch.nTransformer")


def import_ngpt_pytorch():
    """The ``nGPT_pytorch`` package with hashable modules (raises ImportError when not installed)."""
    package = importlib.import_module("nGPT_pytorch")
    for name in _MODULES:
        module = sys.modules[name]
        for obj in vars(module).values():
            if isinstance(obj, type) and issubclass(obj, nn.Module) and obj.__hash__ is None:
                obj.__hash__ = nn.Module.__hash__
    return package
