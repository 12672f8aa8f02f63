"""PowerNorm (Shen, Yao, Gholami, Mahoney, Keutzer; "PowerNorm: Rethinking Batch Normalization in Transformers",
ICML 2020; code sIncerass/powernorm).

Batch normalisation rethought for transformers: no mean, the quadratic mean (second moment) per channel as the
statistic, running statistics in the forward pass after a warmup, and an approximate backward that carries the
statistic's gradient as a running average instead of through the batch. The reference is ``MaskPowerNorm`` with
``PowerFunction`` and ``GroupScaling1D`` in ``fairseq/modules/norms/mask_powernorm.py`` (commit 9ea6226; cited as
``pn.py`` below):

- Group scaling first (``pn.py:17-37``, ``:140``): each token's channels, in ``group_num`` groups (the number of
  heads, ``fairseq/modules/norm_select.py:18-19``), are divided by their root mean square (eps 1e-5). Plain autograd.
- Then per channel ``x2 = mean(x^2)`` over every token (``:56``); during warmup (iteration <= ``warmup_iters``)
  ``z = x / sqrt(x2 + eps)``, after it ``z = x / sqrt(running_phi + eps)`` (``:58-62``); ``y = weight * z + bias``
  (``:70``).
- Running statistic: a cumulative average during warmup, then (and also during warmup, after the average) an EMA
  ``running_phi = a_fwd * running_phi + (1 - a_fwd) * x2`` with a_fwd = 0.9 (``:67-69``).
- Approximate backward (``:84-95``): ``g = grad_y * weight``; ``approx = g - (1 - a_bkw) * ema_gz * z``;
  ``ema_gz += mean(approx * z)`` per channel; ``grad_x = approx / sqrt(x2 + eps)`` with the batch's x2, even once the
  forward divides by the running statistic; weight and bias get the exact sums of ``grad_y * z`` and ``grad_y``.
- At inference the running statistic alone (``:168-172``); the group scaling still runs per token, so PowerNorm is
  not an affine map at inference and does not fold.

Named differences from the reference:
- ``sync`` (default on): statistics (x2 and the backward's mean) over the global batch, summed across data-parallel
  processes, as this project's other batch norms; the reference computes them per process (``sync: false``).
- The iteration counter is the reference's, one per training forward pass, in a buffer (``:164``).
- Causal models: during warmup the training statistics mix every position of the batch, later tokens included;
  after it the forward divides by the running statistic and inference leaks nothing. The reference is an encoder
  norm (its decoders keep LayerNorm, ``README.md``: ``power power layer layer``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from arch_plugins.declarations import declare_roles
from arch_plugins.interfaces import NormStrategy, Role, Site, StackInfo
from arch_plugins.norms.batch_norm import processes, sum_across_processes

BLOCK_SITES = (Site.ATTN_IN, Site.MLP_IN)


class GroupScaling(nn.Module):
    """Each token's channels divided by their RMS within ``groups`` equal groups (the reference's GroupScaling1D)."""

    def __init__(self, groups: int, eps: float = 1e-5):
        super().__init__()
        self.groups, self.eps = groups, eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # grouped / sqrt(mean(grouped^2) + eps) is RMSNorm over the group's width, eps inside the root: the fused
        # native op computes it in one kernel each way on CUDA (rsqrt-multiply instead of sqrt-divide: rounding only).
        grouped = x.reshape(*x.shape[:-1], self.groups, x.shape[-1] // self.groups)
        return F.rms_norm(grouped, (grouped.shape[-1],), eps=self.eps).reshape(x.shape)

    def extra_repr(self) -> str:
        return f"groups={self.groups}, eps={self.eps:g}"


class _PowerFunction(torch.autograd.Function):
    """Forward and approximate backward of PowerNorm on (N, C) tokens; buffers are updated in place.

    Each op is a kernel launch on a GPU, at 25 sites of a 12-layer model: the token count is a Python number on one
    process, the affine map one ``addcmul``, and the backward's correction ``g - (1 - alpha) ema_gz z`` one
    ``addcmul`` with its scalar folded in (issue 43; ``tests/test_statistic_norms_rewrite.py`` holds the version before
    and checks they agree).
    """

    @staticmethod
    def forward(ctx, x, weight, bias, pn: PowerNorm):
        # The warmup tests read the iteration counter where it lives, on the device: both sides of each branch are
        # computed and torch.where picks, elementwise, the same values the reference's Python `if` picks. No host
        # read of the counter (a sync per forward on a GPU), no graph break under compile.
        it = pn.iters.float()  # exact below 2**24 iterations
        world = processes() if pn.sync else 1
        # Summed across processes only when there are several; a Python number divides as the one-element tensor.
        count = (pn.reduce(torch.full((1,), float(x.shape[0]), device=x.device)) if world > 1
                 else float(x.shape[0]))
        var = pn.reduce(x.square().sum(dim=0)) / count
        z = x / (torch.where(pn.iters <= pn.warmup_iters, var, pn.running_phi) + pn.eps).sqrt()
        # The cumulative average of the warmup, then (always) the EMA: pn.py:67-69. Divided by the counter as a
        # tensor: the same numbers on a CPU; on CUDA the host-int division it replaces was a multiplication by the
        # reciprocal (ATen's kernel for a host scalar), so the warmup average may differ there in the last bit.
        averaged = torch.where(pn.iters < pn.warmup_iters, pn.running_phi * (it - 1) / it + var / it, pn.running_phi)
        pn.running_phi.copy_(pn.alpha_fwd * averaged + (1 - pn.alpha_fwd) * var)
        ctx.pn, ctx.count, ctx.world = pn, count, world
        ctx.save_for_backward(z, var, weight)
        return torch.addcmul(bias, weight, z)

    @staticmethod
    def backward(ctx, grad_y):
        pn = ctx.pn
        z, var, weight = ctx.saved_tensors
        g = grad_y * weight
        # ema_gz is kept at the whole batch's gradient scale, a process's own gradients are `world` times it (see
        # ``processes``), so the buffer does not depend on the number of processes.
        world = ctx.world
        approx = torch.addcmul(g, pn.ema_gz, z, value=-(1 - pn.alpha_bkw) * world)
        # add_, not +=: += also sets the module's attribute, a side effect compile cannot keep inside the function.
        pn.ema_gz.add_(pn.reduce((approx * z).sum(dim=0)) / (ctx.count * world))
        gx = approx / torch.sqrt(var + pn.eps)
        return gx, (grad_y * z).sum(dim=0), grad_y.sum(dim=0), None


class PowerNorm(nn.Module):
    """Group scaling, then PowerNorm's per-channel quadratic-mean normalisation over every token of (..., C)."""

    def __init__(self, dim: int, groups: int = 1, eps: float = 1e-5, alpha_fwd: float = 0.9, alpha_bkw: float = 0.9,
                 warmup_iters: int = 10000, sync: bool = True):
        super().__init__()
        if dim % groups:
            raise ValueError(f"PowerNorm's group scaling splits {dim} channels into {groups} equal groups: choose "
                             f"group_num among the divisors of d_model")
        self.eps, self.alpha_fwd, self.alpha_bkw, self.warmup_iters, self.sync = eps, alpha_fwd, alpha_bkw, \
            warmup_iters, sync
        self.group_scaling = GroupScaling(groups)
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))
        declare_roles(self, {"weight": Role.GAIN, "bias": Role.BIAS})
        self.register_buffer("running_phi", torch.ones(dim))
        self.register_buffer("ema_gz", torch.zeros(dim))
        self.register_buffer("iters", torch.zeros(1, dtype=torch.long))

    def reduce(self, t: torch.Tensor) -> torch.Tensor:
        return sum_across_processes(t) if self.sync else t

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scaled = self.group_scaling(x.float())
        flat = scaled.reshape(-1, x.shape[-1])
        if self.training:
            self.iters += 1
            y = _PowerFunction.apply(flat, self.weight, self.bias, self)
        else:
            y = self.weight * flat / (self.running_phi + self.eps).sqrt() + self.bias
        return y.reshape(x.shape).to(x.dtype)

    def extra_repr(self) -> str:
        return (f"{self.weight.shape[0]}, eps={self.eps:g}, alpha_fwd={self.alpha_fwd:g}, "
                f"alpha_bkw={self.alpha_bkw:g}, warmup={self.warmup_iters}, sync={self.sync}")


class PowerNormStrategy(NormStrategy):
    """PowerNorm: group scaling, then quadratic-mean batch statistics (running after warmup), approximate backward.

    At every pre-norm site, as the reference's IWSLT14 runs (``transformer_iwslt_de_en_v2`` is pre-norm,
    ``fairseq/models/transformer.py:796-798``; PowerNorm at both block norms,
    ``fairseq/modules/transformer_layer.py:36,50``, and the encoder's final norm,
    ``fairseq/models/transformer.py:319``).

    Defaults are the reference's: eps 1e-5, alpha_fwd = alpha_bkw = 0.9 (``pn.py:103-104``), groups = heads
    (``norm_select.py:19``). Warmup: the block norms get ``--warmup-updates``, the learning-rate warmup of the run
    (``trans-scripts/train/train-iwslt14.sh``: 8000), and the final norm NormSelect's default 1000
    (``norm_select.py:12``, called without it at ``transformer.py:319``).

    Args:
        warmup_iters: training forward passes with batch statistics at the block norms (the reference's 8000).
        final_warmup_iters: the same for the final norm (the reference's 1000).
        group_num: groups of the group scaling (None: the number of heads).
        eps, alpha_fwd, alpha_bkw: as the reference's.
        sync: statistics over the global batch across data-parallel processes (the reference: per process).
    """

    def __init__(self, warmup_iters: int = 8000, final_warmup_iters: int = 1000, group_num: int | None = None,
                 eps: float = 1e-5, alpha_fwd: float = 0.9, alpha_bkw: float = 0.9, sync: bool = True):
        for name, value in (("warmup_iters", warmup_iters), ("final_warmup_iters", final_warmup_iters)):
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a number of training iterations >= 0, got {value!r}")
        if group_num is not None and (not isinstance(group_num, int) or group_num < 1):
            raise ValueError(f"group_num must be a positive number of groups or null (the heads), got {group_num!r}")
        for name, value in (("alpha_fwd", alpha_fwd), ("alpha_bkw", alpha_bkw)):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must lie in [0, 1], got {value}")
        self.warmup_iters, self.final_warmup_iters, self.group_num = warmup_iters, final_warmup_iters, group_num
        self.eps, self.alpha_fwd, self.alpha_bkw, self.sync = eps, alpha_fwd, alpha_bkw, sync

    def site(self, site: str, dim: int, layer: int | None, stack: StackInfo) -> nn.Module | None:
        if site not in (*BLOCK_SITES, Site.FINAL):
            return None
        warmup = self.warmup_iters if site in BLOCK_SITES else self.final_warmup_iters
        groups = self.group_num if self.group_num is not None else stack.num_heads
        return PowerNorm(dim, groups, self.eps, self.alpha_fwd, self.alpha_bkw, warmup, self.sync)
