"""PRepBN, progressive re-parameterised BatchNorm (SLAB: Guo, Chen, Tang, Wang; ICML 2024; code xinghaochen/SLAB).

Each norm starts as LayerNorm (or RMSNorm) and is replaced over a schedule of training steps by RepBN,
``BN(x) + alpha * x`` (``classification/models/prepbn.py``):

    training, step < warmup:          LN(x)
    training, after:                  lam * LN(x) + (1 - lam) * RepBN(x),   lam = r0 * (1 - k / transition)
                                      (k = step - warmup; lam stays 0 once k >= transition)
    inference (eval):                 RepBN(x) with BatchNorm's running statistics, at every step

RepBN at inference is a per-channel affine map (``inference_affine``), so it folds into the next linear
layer (``lit.procedures.fold.fold_affine_norms``; the reference's ``merge_bn``): the deployed model has no
normalisation left. Batch statistics are over every token of the global batch, synchronised across
data-parallel processes (``batch_norm.py``).

The schedule follows the optimizer step (given through ``arch_plugins.progress``); the reference counts
training forward passes in buffers (its LLaMA code one per 16, its gradient accumulation), which is the
same with one micro-batch per step and stays right with accumulation and activation recomputation.

A causal model's batch statistics mix every position of the training batch, later tokens included (as in
the reference's LLaMA code); at inference the running statistics are fixed and nothing leaks.
"""

from __future__ import annotations

import torch
from torch import nn

from arch_plugins.declarations import TrainingProgress, declare_diagnostic, declare_progress_hook, declare_role
from arch_plugins.init_identity import InitIdentity
from arch_plugins.interfaces import Kind, NormStrategy, Site, StackInfo
from arch_plugins.norms.batch_norm import SyncTokenBatchNorm

SITES = (Site.ATTN_IN, Site.MLP_IN, Site.FINAL)


class RepBN(nn.Module):
    """``BN(x) + alpha * x`` with alpha one learnable scalar; BatchNorm over all tokens, synchronised."""

    def __init__(self, dim: int, eps: float, alpha_init: float, zero_init: bool, sync: bool):
        super().__init__()
        self.alpha = nn.Parameter(torch.full((1,), float(alpha_init)))
        declare_role(self, "alpha", "repbn_alpha", kind=Kind.SCALAR, group="norms")
        self.bn = SyncTokenBatchNorm(dim, eps=eps, sync=sync)
        if zero_init:  # the reference's LLaMA: gamma = beta = 0 (and alpha = 0), RepBN outputs 0 at init
            nn.init.zeros_(self.bn.weight)
            nn.init.zeros_(self.bn.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(x) + self.alpha * x

    def inference_affine(self) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = self.bn.inference_scale_shift()
        return a + self.alpha, b


class ProgressiveRepBN(nn.Module):
    """LayerNorm (or RMSNorm) blended into RepBN over a schedule of steps; RepBN alone at inference."""

    def __init__(self, first: nn.Module, repbn: RepBN, warmup: int | float, transition: int | float, r0: float):
        super().__init__()
        self.first, self.repbn, self.r0 = first, repbn, r0
        # Steps (int) or fractions of the run (float), resolved when the run's length is known.
        self.warmup, self.transition = warmup, transition
        # lam is a tensor, set in place: a compiled block reads it instead of recompiling for every new value.
        self.register_buffer("lam", torch.tensor(float(r0)), persistent=False)
        self.in_warmup = bool(warmup)  # where the schedule stands at step 0
        declare_progress_hook(self, ProgressiveRepBN.on_progress)
        declare_diagnostic(self, "lam", _lam)

    def on_progress(self, progress: TrainingProgress) -> None:
        lam, self.in_warmup = schedule(progress, self.warmup, self.transition, self.r0)
        self.lam.fill_(lam)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return self.repbn(x)
        if self.in_warmup:
            return self.first(x)
        # Both computed whatever lam, as the reference: RepBN's running statistics start with the transition, and
        # the first norm's parameters still take part at lam = 0 (zero gradients), which DDP requires of every
        # parameter unless told to look for unused ones. (During a warmup RepBN's do not take part, as in the
        # reference: under DDP a warmup needs --trainer.strategy=ddp_find_unused_parameters_true.)
        return self.lam * self.first(x) + (1.0 - self.lam) * self.repbn(x)

    def inference_affine(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(a, b): the eval output is ``a * x + b`` per channel."""
        return self.repbn.inference_affine()


def _lam(module: ProgressiveRepBN) -> torch.Tensor:
    return torch.zeros(()) if module.in_warmup else module.lam.clone()


def _resolve(value: int | float, total: int | None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"a schedule length must be a number of steps or a fraction of the run, got {value!r}")
    if isinstance(value, int):
        return value
    if total is None:
        if value == 0:
            return 0
        raise ValueError("prepbn's schedule is given as a fraction of the run, whose length is unknown here; "
                         "give warmup_steps and transition_steps as numbers of steps")
    return round(value * total)


def schedule(progress: TrainingProgress, warmup: int | float, transition: int | float,
             r0: float) -> tuple[float, bool]:
    """(lam, in_warmup) at ``progress``: the reference's ``LinearNorm`` with its counters read from the step."""
    warm = _resolve(warmup, progress.total_steps)
    if progress.step < warm:
        return float(r0), True
    span = max(1, _resolve(transition, progress.total_steps))
    k = progress.step - warm
    return float(r0) * max(span - k, 0) / span, False


class PRepBNStrategy(NormStrategy):
    """PRepBN (SLAB): every pre-norm LayerNorm progressively replaced by re-parameterised BatchNorm.

    Defaults follow the reference for the kind of stack. An encoder (ViT) takes its DeiT setting
    (``classification/models/deit.py``, ``prepbn.py``): LayerNorm eps 1e-6, alpha 1, BatchNorm gamma 1
    and beta 0, eps 1e-5. A language model takes its LLaMA-350M setting
    (``llama/modeling/llama-350M/modeling_llama.py``): RMSNorm, alpha 0 and BatchNorm gamma = beta = 0,
    eps 1e-6 for both. The schedule: no warmup and a transition over 80% of the run, DeiT-S's
    ``step=300000`` of its 300 epochs of 1251 steps (the LLaMA run's length is not in the repository;
    its code has warm=10000, step=18000).

    Args:
        base: the norm replaced, ``layernorm`` or ``rmsnorm`` (None: by the kind of stack, as above).
        eps: epsilon of that norm and of BatchNorm (None: by the kind of stack, as above).
        alpha_init: RepBN's initial alpha (None: by the kind of stack).
        bn_zero_init: start BatchNorm's gamma and beta at 0 (None: by the kind of stack).
        warmup_steps, transition_steps: the schedule in optimizer steps; None: the fractions below.
        warmup_fraction, transition_fraction: the schedule as fractions of the run's optimizer steps.
        r0: lambda at the start of the transition (the reference's default 1.0).
        sync: synchronise batch statistics across data-parallel processes.
    """

    # Before the transition lambda = 1: the replaced norm alone.
    init_identities = (InitIdentity("rmsnorm", {"base": "rmsnorm", "eps": 1e-6}),)

    def __init__(self, base: str | None = None, eps: float | None = None, alpha_init: float | None = None,
                 bn_zero_init: bool | None = None, warmup_steps: int | None = None,
                 transition_steps: int | None = None, warmup_fraction: float = 0.0, transition_fraction: float = 0.8,
                 r0: float = 1.0, sync: bool = True):
        if base not in (None, "layernorm", "rmsnorm"):
            raise ValueError(f"base must be layernorm or rmsnorm, got {base!r}")
        for name, value in (("warmup_fraction", warmup_fraction), ("transition_fraction", transition_fraction)):
            if not 0.0 <= float(value) <= 1.0:
                raise ValueError(f"{name} must lie in [0, 1], got {value}")
        for name, value in (("warmup_steps", warmup_steps), ("transition_steps", transition_steps)):
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ValueError(f"{name} must be a number of steps >= 0, got {value!r}")
        self.base, self.eps, self.alpha_init, self.bn_zero_init = base, eps, alpha_init, bn_zero_init
        self.warmup = warmup_steps if warmup_steps is not None else float(warmup_fraction)
        self.transition = transition_steps if transition_steps is not None else float(transition_fraction)
        self.r0, self.sync = r0, sync

    def site(self, site: str, dim: int, layer: int | None, stack: StackInfo) -> nn.Module | None:
        if site not in SITES:
            return None
        lm = stack.causal
        base = self.base or ("rmsnorm" if lm else "layernorm")
        eps = self.eps if self.eps is not None else 1e-6
        bn_eps = self.eps if self.eps is not None else (1e-6 if lm else 1e-5)
        alpha = self.alpha_init if self.alpha_init is not None else (0.0 if lm else 1.0)
        zero = self.bn_zero_init if self.bn_zero_init is not None else lm
        first = nn.RMSNorm(dim, eps=eps) if base == "rmsnorm" else nn.LayerNorm(dim, eps=eps)
        return ProgressiveRepBN(first, RepBN(dim, bn_eps, alpha, zero, self.sync), self.warmup, self.transition,
                                self.r0)
