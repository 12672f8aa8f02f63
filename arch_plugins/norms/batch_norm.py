"""BatchNorm over every token of the global batch, synchronised across data-parallel processes.

Statistics are per channel over all tokens of all samples on all processes (SyncBatchNorm's semantics):
the sums are all-reduced with ``torch.distributed.nn.functional.all_reduce``, which is differentiable (its
backward all-reduces the gradient), so the gradient is the one of the global batch too. The mean is
reduced first and the variance around it second (two small all-reduces of C numbers) rather than
E[x^2] - E[x]^2, which loses precision in fp32 when the mean is large against the spread.
``nn.SyncBatchNorm`` does the same but runs only on GPUs; this one runs on CPU and gloo as well.

Running statistics follow ``nn.BatchNorm1d``: momentum 0.1, unbiased variance (n / (n - 1)).

With nothing to synchronise (one process, or ``sync`` off) the same statistics are the native ``F.batch_norm``'s,
which computes them in one fused kernel each way; the hand-written two-pass path above serves the synchronised case.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from arch_plugins.declarations import declare_roles
from arch_plugins.interfaces import Role


def _distributed() -> bool:
    """Whether there are other data-parallel processes to reduce statistics with."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _all_reduce(t: torch.Tensor) -> torch.Tensor:
    if not _distributed():
        return t
    from torch.distributed.nn.functional import all_reduce

    return all_reduce(t)


def sum_across_processes(t: torch.Tensor) -> torch.Tensor:
    """``t`` summed over the data-parallel processes, outside autograd: for statistics that custom backward
    passes (UN's, PowerNorm's) read and never differentiate. ``t`` itself when not distributed."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return t
    t = t.detach().clone()
    dist.all_reduce(t)
    return t


def processes() -> int:
    """The number of data-parallel processes (1 when not distributed).

    A statistic of the gradient summed across processes needs it: each process differentiates the mean loss of its
    own share of the batch, so its per-token gradients are ``processes()`` times the whole batch's (the data-parallel
    wrapper divides the summed parameter gradients by the same number)."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


class SyncTokenBatchNorm(nn.Module):
    """BatchNorm of (..., C) inputs over all leading dims and all processes; affine gamma, beta."""

    def __init__(self, dim: int, eps: float = 1e-5, momentum: float = 0.1, sync: bool = True):
        super().__init__()
        self.eps, self.momentum, self.sync = eps, momentum, sync
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))
        declare_roles(self, {"weight": Role.GAIN, "bias": Role.BIAS})
        self.register_buffer("running_mean", torch.zeros(dim))
        self.register_buffer("running_var", torch.ones(dim))

    def _reduce(self, t: torch.Tensor) -> torch.Tensor:
        return _all_reduce(t) if self.sync else t

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return self.affine_at_inference_apply(x)
        flat = x.reshape(-1, x.shape[-1]).float()
        if flat.shape[0] > 1 and not (self.sync and _distributed()):
            # One process's statistics: the native BatchNorm computes exactly this (biased variance in the
            # normalisation, the unbiased one lerped into the running variance with the same momentum) in one fused
            # kernel each way. Synchronised statistics (and a lone token, which the native op refuses) take the
            # path below.
            y = F.batch_norm(flat, self.running_mean, self.running_var, self.weight, self.bias, training=True,
                             momentum=self.momentum, eps=self.eps)
            return y.reshape(x.shape).to(x.dtype)
        count = self._reduce(torch.full((1,), float(flat.shape[0]), device=x.device))
        mean = self._reduce(flat.sum(dim=0)) / count
        centred = flat - mean
        var = self._reduce(centred.square().sum(dim=0)) / count
        with torch.no_grad():
            unbiased = var * (count / (count - 1).clamp(min=1))
            self.running_mean.lerp_(mean.detach().to(self.running_mean.dtype), self.momentum)
            self.running_var.lerp_(unbiased.detach().to(self.running_var.dtype), self.momentum)
        y = centred * torch.rsqrt(var + self.eps) * self.weight + self.bias
        return y.reshape(x.shape).to(x.dtype)

    def inference_scale_shift(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(a, b) with eval output a * x + b: the running statistics folded with gamma and beta."""
        inv = torch.rsqrt(self.running_var + self.eps)
        return self.weight * inv, self.bias - self.weight * self.running_mean * inv

    def affine_at_inference_apply(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.inference_scale_shift()
        return (x * a + b).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps:g}, momentum={self.momentum:g}, sync={self.sync}"
