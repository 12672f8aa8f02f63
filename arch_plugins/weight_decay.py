"""Parameters whose weight decay differs from the default declare it themselves, as unit-norm weights do.

The optimizer's default is nanoGPT's: matrices and embeddings decay, vectors (norm gains, biases, learned
scalars) do not. Some references decay differently (DyT's LLaMA code decays every parameter, alpha, gamma
and the embedding scalar included), so the module that owns a parameter may say so:

    declare_weight_decay(self, "alpha", True)     # decay this vector at the run's weight decay
    declare_weight_decay(self, "table", False)    # never decay this matrix

The optimizer (``lit/optim.py``) walks ``model.modules()`` and asks, instead of matching parameter names or
knowing plugins. Pure PyTorch: nothing here knows about Lightning.
"""

from __future__ import annotations

from collections.abc import Iterator

from torch import nn

_ATTR = "weight_decay_declared"


def declare_weight_decay(module: nn.Module, param_name: str, decay: bool) -> None:
    """Declare that ``module.<param_name>`` decays (``True``) or not (``False``), whatever its shape."""
    if not isinstance(getattr(module, param_name, None), nn.Parameter):
        raise ValueError(f"{type(module).__name__} has no parameter {param_name!r} to declare weight decay for")
    if not isinstance(decay, bool):
        raise TypeError(f"decay must be True or False, got {decay!r}")
    declared = dict(getattr(module, _ATTR, {}))
    declared[param_name] = decay
    # A plain attribute (not a buffer): it survives FSDP/compile wrapping and is not saved in checkpoints. The
    # parameter is looked up by name when asked, so a wrapper that swaps it (FSDP2's DTensors) is followed.
    object.__setattr__(module, _ATTR, declared)


def declared_weight_decay(model: nn.Module) -> Iterator[tuple[nn.Parameter, bool]]:
    """Every declared (parameter, decay) of ``model``, in module order."""
    for module in model.modules():
        for param_name, decay in getattr(module, _ATTR, {}).items():
            yield getattr(module, param_name), decay


def decays(model: nn.Module) -> dict[int, bool]:
    """Whether each trainable parameter of ``model`` decays, by ``id``: its declaration, else ``ndim >= 2``.

    A parameter declared twice with different answers (a tied weight whose two owners disagree) is an error.
    """
    result = {id(p): p.dim() >= 2 for p in model.parameters()}
    declared: dict[int, bool] = {}
    for param, decay in declared_weight_decay(model):
        if declared.setdefault(id(param), decay) != decay:
            raise ValueError("a parameter is declared both to decay and not to decay (tied weights disagree)")
        result[id(param)] = decay
    return result
