"""Dense projections say which rows of their weight play which role (q, k, v, attention output, ...).

A component that reads another module's weights as matrices (BHyT's variance approximation reads W_V and
W_O of its block) finds them by role instead of by attribute name: attribute names belong to the model
code and change with every projection type, while the projection that built a weight knows what it is.
Only projections that really are ``x @ W.T (+ b)`` declare roles (``arch_plugins/projections/linear.py``);
Pattention's parameter tokens are not a matrix applied to the input, so it declares none, and a
component that needs a matrix says so in one line instead of computing something meaningless.

Pure PyTorch: nothing here knows about Lightning.
"""

from __future__ import annotations

import torch
from torch import nn

_ATTR = "dense_role_rows"


def declare_dense_rows(module: nn.Module, rows: dict[str, tuple[int, int]]) -> None:
    """Declare that rows ``start:stop`` of ``module.weight`` (shape (d_out, d_in)) compute role ``role``."""
    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise ValueError(f"{type(module).__name__} has no 2-D weight whose rows could play roles")
    declared = dict(getattr(module, _ATTR, {}))
    declared.update(rows)
    # A plain attribute: it survives FSDP/compile wrapping and is not saved in checkpoints.
    object.__setattr__(module, _ATTR, declared)


def dense_role(within: nn.Module, role: str) -> tuple[nn.Module, int, int] | None:
    """The (module, start, stop) inside ``within`` whose weight rows ``start:stop`` play ``role``, or None.

    The module is returned rather than the tensor: wrappers that swap parameters (FSDP2 gathers them for
    the forward pass) are followed when the weight is read, as ``module.weight[start:stop]``.
    """
    for module in within.modules():
        rows = getattr(module, _ATTR, {}).get(role)
        if rows is not None:
            return module, rows[0], rows[1]
    return None


def dense_weight(found: tuple[nn.Module, int, int]) -> torch.Tensor:
    """The rows of a ``dense_role`` result, as the module holds them now."""
    module, start, stop = found
    return module.weight[start:stop]
