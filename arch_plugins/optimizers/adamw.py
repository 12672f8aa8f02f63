"""AdamW for every parameter, with per-role learning-rate and weight-decay multipliers."""

from __future__ import annotations

import torch
from torch import nn

from arch_plugins.declarations import parameter_roles
from arch_plugins.interfaces import OptimizerType
from arch_plugins.optimizers.routing import (
    check_betas,
    check_multipliers,
    own_betas,
    own_eps,
    param_groups,
    settings,
)


class AdamWOptimizer(OptimizerType):
    """AdamW (decoupled weight decay) for all parameters: the default, nanoGPT's recipe.

    Matrices and embeddings decay, vectors and scalars do not, unless a module declares otherwise
    (``declare_weight_decay``). Without multipliers this is exactly the optimizer the project always built: two
    groups (decay, no decay) in the model's parameter order.

    Args:
        lr_multipliers: the learning rate of a role or kind relative to ``--model.lr``, e.g.
            ``{embedding: 0.3, head: 0.003125, vector: 0.01}`` (a role's entry wins over its kind's).
        wd_multipliers: the weight decay of a role or kind relative to ``--model.weight_decay`` (parameters
            that do not decay stay at 0).
        role_betas: Adam betas of a role or kind where they differ from ``--model.betas``, e.g.
            ``{embedding: [0.8, 0.95], head: [0.8, 0.95]}``.
        eps: Adam's epsilon.
        fused: use torch's fused AdamW kernel (one launch per step for all parameters of a group, no step counter
            on the host: nanoGPT's and torchtitan's choice on GPUs). None: fused where every parameter is on a CUDA
            device, torch's default elsewhere (on a CPU the update, and so every result, is the one it always was).
            Set false under ``--trainer.precision=16-mixed`` with gradient clipping (Lightning cannot clip before a
            step that unscales fp16 gradients itself; the task does this for you).
    """

    def __init__(self, lr_multipliers: dict[str, float] | None = None,
                 wd_multipliers: dict[str, float] | None = None,
                 role_betas: dict[str, list[float]] | None = None, eps: float = 1e-8, fused: bool | None = None):
        self.lr_multipliers = check_multipliers("lr_multipliers", lr_multipliers)
        self.wd_multipliers = check_multipliers("wd_multipliers", wd_multipliers)
        self.role_betas = check_betas(role_betas)
        self.eps = float(eps)
        self.fused = fused

    def build(self, model: nn.Module, *, lr: float, weight_decay: float,
              betas: tuple[float, float]) -> torch.optim.AdamW:
        # strict=False: a third-party plugin that predates roles still trains (its matrices decay, by shape).
        roles = parameter_roles(model, strict=False)
        found = settings(model, roles, lr_multipliers=self.lr_multipliers, wd_multipliers=self.wd_multipliers,
                         role_betas=self.role_betas)
        groups = param_groups([(p.param, {"lr": lr * m, "lr_ratio": m, "weight_decay": weight_decay * w,
                                          **own_betas(self.role_betas, p), **own_eps(self.eps, declared)})
                               for p, m, w, declared in found])
        fused = self.fused if self.fused is not None else on_cuda(model)
        return torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), eps=self.eps, **({"fused": True} if fused else {}))


def on_cuda(model: nn.Module) -> bool:
    """Whether every parameter lives on a CUDA device (FSDP2's DTensors report their local device): where torch's
    fused AdamW kernel runs."""
    params = list(model.parameters())
    return bool(params) and all(p.device.type == "cuda" for p in params)
