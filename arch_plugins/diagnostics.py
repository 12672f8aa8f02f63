"""Learned scalars that a component wants watched declare it themselves, as unit-norm weights do.

A diagnostics callback (``lit/diagnostics``) walks ``model.modules()`` and asks, instead of matching
parameter names or knowing plugins: DyT's alpha, LAUREL's alpha/beta/gamma, nGPT's eigen learning rates
are each declared by the module that owns them, under a short name, with a function that returns the
value the forward pass actually uses (nGPT's scale trick stores one value and uses another).

    declare_diagnostic(self, "alpha")                                  # a parameter, as stored
    declare_diagnostic(self, "alpha", lambda m: m.alpha().abs())       # the effective value

A value with several elements is reported as its mean; declare several names (or a norm) where the mean
would hide what matters. Pure PyTorch: nothing here knows about Lightning.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator

import torch
from torch import nn

_ATTR = "diagnostic_scalars"

ScalarFn = Callable[[nn.Module], torch.Tensor]


def declare_diagnostic(module: nn.Module, name: str, fn: ScalarFn | None = None) -> None:
    """Declare that ``fn(module)`` (default: the parameter or buffer ``module.<name>``) is worth recording as ``name``.

    ``fn`` receives the module (not a closure over it, so no reference cycle is made and a module-level
    function or ``functools.partial`` keeps the model picklable). It is called under ``torch.no_grad``,
    at most every few steps; under FSDP2 the parameters it reads are DTensor shards, and plain tensor
    operations on them give the global value (the caller gathers the result).
    """
    if not name or "/" in name:
        raise ValueError(f"a diagnostic name must be a non-empty metric name without '/', got {name!r}")
    if fn is None:
        if not isinstance(getattr(module, name, None), torch.Tensor):
            raise ValueError(f"{type(module).__name__} has no tensor {name!r} to record; pass fn")
        fn = operator.attrgetter(name)
    declared = dict(getattr(module, _ATTR, {}))
    declared[name] = fn
    # A plain attribute (not a buffer, not a submodule): it survives FSDP/compile wrapping, is not saved
    # in checkpoints, and costs nothing in the forward pass.
    object.__setattr__(module, _ATTR, declared)


def declared_diagnostics(model: nn.Module) -> Iterator[tuple[str, nn.Module, ScalarFn]]:
    """Every declared (``<module path>.<name>``, module, fn) of ``model``, in module order."""
    for module_name, module in model.named_modules():
        for name, fn in getattr(module, _ATTR, {}).items():
            yield (f"{module_name}.{name}" if module_name else name), module, fn


def has_diagnostics(model: nn.Module) -> bool:
    return next(declared_diagnostics(model), None) is not None
