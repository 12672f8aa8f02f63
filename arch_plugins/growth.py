"""Loading a smaller model's weights into a larger one: the modules that can grow take their old part.

A module that can grow implements ``grow_from(old_state, *, new_keys, preserve_function)`` (TokenFormer's
Pattention does) and reports what it grew in one line (``"32 -> 64 tokens"``), or None when it kept its size;
nothing here knows which modules those are or what their tensors are called. Every other tensor must match
the new model exactly, so growth never hides a mismatched architecture. Pure PyTorch, for any task model.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn


class GrowthError(ValueError):
    """The checkpoint does not fit the model, even allowing for growth."""


def load_grown(model: nn.Module, state_dict: dict[str, torch.Tensor], *, new_keys: Literal["zero", "init"] = "zero",
               preserve_function: bool = True) -> list[str]:
    """Load ``state_dict`` into ``model``, growing every growable module. Returns what was grown (for the log)."""
    remaining = dict(state_dict)
    grown = []
    for name, module in model.named_modules():
        if not hasattr(module, "grow_from"):
            continue
        prefix = f"{name}." if name else ""
        old = {k[len(prefix):]: remaining.pop(k) for k in list(remaining) if k.startswith(prefix)
               and "." not in k[len(prefix):]}
        if not old:
            raise GrowthError(f"the checkpoint has no weights for {name or 'the model'}: "
                              "it is not a smaller version of this model")
        try:
            report = module.grow_from(old, new_keys=new_keys, preserve_function=preserve_function)
        except (KeyError, ValueError) as exc:
            raise GrowthError(f"{name}: {exc}") from exc
        if report:
            grown.append(f"{name}: {report}")
    growable = {f"{n}." for n, m in model.named_modules() if hasattr(m, "grow_from")}
    expected = {k for k in model.state_dict() if not any(k.startswith(p) for p in growable)}
    missing, unexpected = sorted(expected - remaining.keys()), sorted(remaining.keys() - expected)
    if missing or unexpected:
        raise GrowthError(f"the checkpoint is not a smaller version of this model: missing {missing[:3]}, "
                          f"unexpected {unexpected[:3]}")
    try:
        model.load_state_dict(remaining, strict=False)
    except RuntimeError as exc:  # shape mismatch of a tensor that cannot grow
        first = str(exc).strip().splitlines()[-1].strip()
        raise GrowthError(f"only modules that implement grow_from can grow; {first}") from exc
    return grown
