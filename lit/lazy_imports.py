"""Keeps ``import lightning`` from importing what this project never uses through torchmetrics.

Lightning imports torchmetrics, and ``import torchmetrics`` eagerly imports ``scipy.signal`` (a compatibility patch
for one audio metric), torchvision (the backbones of image-quality metrics) and ``matplotlib.pyplot`` (metric
plots): about 3 s of a 17 s ``cli.py fit`` start on 2 cores (benchmarks/startup.py, docs/performance/startup.md).
The project's models use two torchmetrics metrics, ``Perplexity`` and ``MulticlassAccuracy``, which need none of
them. ``install()``, called before Lightning is first imported (``cli.py`` does, for every subcommand), makes
torchmetrics treat those three packages as absent, and only torchmetrics: each stays importable as usual (timm
imports torchvision for the image tasks, ``cli.py compare`` imports matplotlib for its plots). A torchmetrics
feature that needs one of them says so when it is used ("... requires that torchvision is installed").

Nothing happens when torchmetrics is already imported (it was then imported with everything, as before).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

# torchmetrics' own availability flags (torchmetrics/utilities/imports.py) that pull a heavy import at its import.
SKIPPED_FLAGS = ("_TORCHVISION_AVAILABLE", "_MATPLOTLIB_AVAILABLE", "_SCIPY_AVAILABLE", "_SCIPI_AVAILABLE")
SKIPPED_PACKAGES = ("scipy",)  # torchmetrics/__init__.py asks ``package_available("scipy")`` before its patch
WHY = "not loaded by torchmetrics in arch-lab (lit/lazy_imports.py): import it before torchmetrics to use it"


class _AfterExec(importlib.abc.Loader):
    """Runs the real loader, with ``around`` wrapped about the module's execution."""

    def __init__(self, loader, around):
        self.loader, self.around = loader, around

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.around(lambda: self.loader.exec_module(module), module)


class _TorchmetricsOptions(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname == "torchmetrics.utilities.imports":
            around = _mark_flags_absent
        elif fullname == "torchmetrics":
            around = _without_packages
        else:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _AfterExec(spec.loader, around)
        return spec


def _mark_flags_absent(execute, module) -> None:
    execute()
    for name in SKIPPED_FLAGS:
        flag = getattr(module, name, None)
        if flag is not None:
            flag.available, flag.message = False, f"{getattr(flag, 'requirement', name)}: {WHY}"


def _without_packages(execute, module) -> None:
    import lightning_utilities.core.imports as lu

    original = lu.package_available

    def package_available(name: str) -> bool:
        return name not in SKIPPED_PACKAGES and original(name)

    lu.package_available = package_available  # what torchmetrics/__init__.py binds and asks while it runs
    try:
        execute()
    finally:
        lu.package_available = original


_FINDER = _TorchmetricsOptions()


def install() -> None:
    """Before Lightning is imported: torchmetrics will not import scipy, torchvision or matplotlib."""
    if "torchmetrics" not in sys.modules and _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
