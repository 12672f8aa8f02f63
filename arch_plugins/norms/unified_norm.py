"""UN, Unified Normalization (Yang et al., ACM MM 2022; code hikvision-research/Unified-Normalization).

A BatchNorm-family norm for transformers that, like BatchNorm, is a per-channel affine map at inference (so it folds
into the next linear, ``lit.procedures.fold``), and trains on par with LayerNorm thanks to three changes to batch
statistics. The reference is ``UN1d`` and ``UN2dFunction`` in
``image_classification/models/unified_normalization/unified_normalization.py`` (commit 0ce9bf2; cited as ``un.py``
below; the NMT copy under ``neural_machine_translation/fairseq/modules`` differs in one blank line):

- Statistics are the second moment per channel, ``x2 = mean(x^2)`` over every token, no mean subtracted
  (``un.py:38``), and ``y = weight * x / sqrt(var + eps) + bias`` (``:65``, ``:72``).
- Fluctuation smoothing: after ``warmup_iters``, ``var`` is the geometric mean of the last ``window`` batches'
  ``x2`` (a ring buffer, ``:42``, ``:53-56``); the backward's mean of ``g * z`` is likewise averaged over a window of
  batches and an EMA (``:93-107``), and the gradient is compensated by ``r = sqrt(var + eps) / sqrt(running_var +
  eps)`` clamped to [1/5, 5] (1 until iteration max(1000, warmup), ``:59-63``; ``:88-90``).
- Adaptive outlier filtration: when the buffer's arithmetic and geometric means differ by more than ``window``
  times the variance of its square roots in any channel, the batch is an outlier: its slot takes the running
  variance and the step uses its own statistics with no smoothing (``:40-52``).

The backward is the reference's approximation, not the gradient of the forward: ``gx = (g - ema_gz * z) /
sqrt(var + eps)`` with ``g = grad_y * weight * r`` (``:87-109``), and the weight's gradient is ``sum(grad_y * r * z)``
(``:110``). Running statistics: ``running_var = m * running_var + (1 - m) * var`` with momentum m = 0.9 (``:70``),
used alone at inference (``:190-194``).

Named differences from the reference:
- ``sync`` (default on): statistics over the global batch, summed across data-parallel processes, as this project's
  other batch norms (``batch_norm.py``, PRepBN). The reference computes them per process (its 8-GPU T2T-ViT run has
  no all-reduce); ``sync: false`` is that. Synchronised, every process keeps identical buffers.
- The iteration counter is the reference's: one per training forward pass, kept in a buffer (``:186``); with
  gradient accumulation it counts micro-batches, as the reference would.
- ``compensation_start``: the reference's literal 1000 in ``max(1000, warmup_iters)`` (``:60``), an option so a
  short run can reach the compensated regime.
- Causal models: the training statistics mix every position of the batch, later tokens included (as PRepBN's);
  inference uses the running variance only and leaks nothing.
- ``exact_backward_warmup`` (default off, the reference): while ``it < warmup_iters`` the input gradient uses the
  batch's own ``mean(g * z)`` instead of ``ema_gz``, which makes it the exact gradient of the forward; the buffers
  and the EMA are updated as the reference updates them, so the approximation takes over after the warmup with the
  state it would have had. Why: the reference reads ``ema_gz`` from iteration 1, when it is still near its zero
  start (``un.py:103-107``); its IWSLT14 run ramps the learning rate from 1e-7 over 6000 updates, so the error meets
  tiny steps. Under a fast ramp (this project's LM recipe: 3e-3 within 50 steps) the leftover per-channel radial
  term ``(mean(g*z) - ema_gz) * z``, which UN's scale-invariant forward never opposes, blows the residual stream up
  by orders of magnitude (RMS about 550 at the final norm) and the model stays near the unigram entropy.
"""

from __future__ import annotations

import torch
from torch import nn

from arch_plugins.declarations import declare_roles
from arch_plugins.interfaces import NormStrategy, Role, Site, StackInfo
from arch_plugins.norms.batch_norm import processes, sum_across_processes

SITES = (Site.ATTN_IN, Site.MLP_IN, Site.FINAL)
# The reference's clamp of the gradient-compensation ratio r (``un.py:63``).
R_MIN, R_MAX = 1 / 5, 5.0


class _UNFunction(torch.autograd.Function):
    """Forward and approximate backward of UN on (N, C) tokens; buffers are updated in place.

    Every test of the reference's on the iteration counter and the outlier test reads its tensors where they live,
    on the device: both sides of each branch are computed and ``torch.where`` picks, elementwise, the values the
    reference's Python ``if`` picks (the same values, bit for bit), and the buffers' slot ``it % window`` is written
    by ``index_copy_``. No host read (a sync per forward on a GPU), no graph break under compile.

    Each op is a kernel launch on a GPU, and UN runs at 25 sites of a 12-layer model on (C,) vectors mostly: the
    standard deviation is computed once and saved for the backward, the token count is a Python number on one
    process, the affine map is one ``addcmul``, and the per-channel factors meet the (N, C) tensors once
    (issue 43; ``tests/test_statistic_norms_rewrite.py`` holds the version before and checks they agree).
    """

    @staticmethod
    def forward(ctx, x, weight, bias, un: UnifiedNorm):
        it = un.iters  # (1,), already counting this pass
        fp, bp = un.buffer_x2.shape[0], un.buffer_gz.shape[0]
        world = processes() if un.sync else 1
        # Summed across processes only when there are several; a Python number divides as the one-element tensor.
        count = (un.reduce(torch.full((1,), float(x.shape[0]), device=x.device)) if world > 1
                 else float(x.shape[0]))
        x2 = un.reduce(x.square().sum(dim=0)) / count
        slot = it % fp
        recorded_var = torch.var(torch.sqrt(un.buffer_x2))  # over the whole buffer, before this batch enters
        un.buffer_x2.index_copy_(0, slot, x2[None])
        warming = it < un.warmup_iters
        skip = torch.full((1,), fp <= 1, dtype=torch.bool, device=x.device)
        if un.outlier_filtration:
            am = un.buffer_x2.mean(dim=0)
            gm = torch.exp(torch.log(un.buffer_x2).mean(dim=0))
            outlier = ~warming & ((am - gm) > recorded_var * fp).any()
            un.buffer_x2.index_copy_(0, slot, torch.where(outlier, un.running_var, x2)[None])
            skip = skip | outlier
            un.skip_counter.add_(outlier.long())  # not +=, which also sets the attribute (see powernorm.py)
        geometric = torch.exp(torch.log(un.buffer_x2).mean(dim=0))  # the window's geometric mean
        var = torch.where((it <= fp) | warming | skip, x2, geometric)
        std = (var + un.eps).sqrt()
        r = std / (un.running_var + un.eps).sqrt()
        r = torch.where((it <= max(un.compensation_start, un.warmup_iters)) | skip, 1.0, r.clamp(R_MIN, R_MAX))
        z = x / std
        un.running_var.copy_(un.momentum * un.running_var + (1 - un.momentum) * var)
        # What the backward's branches need, decided now: the counter moves on at the next forward.
        batch_gz = (it <= bp) | warming | skip
        exact = skip | warming if un.exact_backward_warmup else skip
        ctx.un, ctx.count, ctx.world = un, count, world
        ctx.save_for_backward(z, std, weight, r, it % bp, skip, batch_gz, exact)
        return torch.addcmul(bias, weight, z)

    @staticmethod
    def backward(ctx, grad_y):
        un, world = ctx.un, ctx.world
        z, std, weight, r, slot, skip, batch_gz, exact = ctx.saved_tensors
        g = grad_y * (weight * r)
        # Kept at the whole batch's gradient scale, so the buffers do not depend on the number of processes; a
        # process's own gradients are `world` times that (see ``processes``).
        gz = un.reduce((g * z).sum(dim=0)) / (ctx.count * world)
        un.buffer_gz.index_copy_(0, slot, torch.where(skip, un.ema_gz, gz)[None])
        mean_gz = torch.where(batch_gz, gz, un.buffer_gz.mean(dim=0))
        un.ema_gz.copy_(un.ema_gz * un.momentum + (1 - un.momentum) * mean_gz)
        # Where `exact`, mean_gz is the batch's gz (skip, or the warmup under exact_backward_warmup).
        used = torch.where(exact, mean_gz, un.ema_gz)
        approx = g - (used * world if world > 1 else used) * z
        gx = approx / std
        return gx, (grad_y * z).sum(dim=0) * r, grad_y.sum(dim=0), None


class UnifiedNorm(nn.Module):
    """UN over the last dim of (..., C) inputs, statistics over every token (the reference's ``UN1d``)."""

    def __init__(self, dim: int, window_size: int | tuple[int, int] = 4, warmup_iters: int = 4000,
                 outlier_filtration: bool = False, eps: float = 1e-5, momentum: float = 0.9,
                 compensation_start: int = 1000, sync: bool = True, exact_backward_warmup: bool = False):
        super().__init__()
        self.exact_backward_warmup = exact_backward_warmup
        fp, bp = (window_size, window_size) if isinstance(window_size, int) else tuple(window_size)
        if fp < 1 or bp < 1:
            raise ValueError(f"window_size must be a positive number of batches (or a pair), got {window_size!r}")
        self.warmup_iters, self.outlier_filtration, self.eps, self.momentum = warmup_iters, outlier_filtration, eps, \
            momentum
        self.compensation_start, self.sync = compensation_start, sync
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))
        declare_roles(self, {"weight": Role.GAIN, "bias": Role.BIAS})
        self.register_buffer("running_var", torch.ones(dim))
        self.register_buffer("ema_gz", torch.zeros(dim))
        self.register_buffer("iters", torch.zeros(1, dtype=torch.long))
        self.register_buffer("buffer_x2", torch.zeros(fp, dim))
        self.register_buffer("buffer_gz", torch.zeros(bp, dim))
        self.register_buffer("skip_counter", torch.zeros(1, dtype=torch.long))

    def reduce(self, t: torch.Tensor) -> torch.Tensor:
        return sum_across_processes(t) if self.sync else t

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            a, b = self.inference_affine()
            return (x * a + b).to(x.dtype)
        self.iters += 1
        flat = x.reshape(-1, x.shape[-1]).float()
        y = _UNFunction.apply(flat, self.weight, self.bias, self)
        return y.reshape(x.shape).to(x.dtype)

    def inference_affine(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(a, b) with eval output a * x + b (``un.py:190-194``): what ``lit.procedures.fold`` folds."""
        return self.weight * torch.rsqrt(self.running_var + self.eps), self.bias

    def extra_repr(self) -> str:
        return (f"{self.weight.shape[0]}, window=({self.buffer_x2.shape[0]}, {self.buffer_gz.shape[0]}), "
                f"warmup={self.warmup_iters}, outlier_filtration={self.outlier_filtration}, eps={self.eps:g}, "
                f"momentum={self.momentum:g}, sync={self.sync}"
                + (", exact_backward_warmup=True" if self.exact_backward_warmup else ""))


class UNStrategy(NormStrategy):
    """UN: window-smoothed second-moment batch statistics with outlier filtration; an affine map at inference.

    At every pre-norm site (the blocks' two and the final norm), where the reference puts it in place of LayerNorm
    (T2T-ViT's ``norm_layer``; fairseq's pre-norm Transformer, ``transformer_layer.py:43,69`` and the final
    ``layer_norm``).

    Defaults are the reference's ``UN1d`` (``un.py:128``: window 4, warmup 4000, eps 1e-5, momentum 0.9) with
    outlier filtration by the kind of stack: on for an encoder (ViT), as its T2T-ViT-14 run
    (``image_classification/models/t2t_vit.py:305``), off for a language model, as its docstring advises for NLP
    and its IWSLT14 run leaves it (``neural_machine_translation/run_iwslt14_train_un.sh:12-14``).

    Args:
        window_size: batches in the smoothing windows, one number or [forward, backward].
        warmup_iters: training forward passes before smoothing and outlier filtration start.
        outlier_filtration: adaptive outlier filtration (None: by the kind of stack, as above).
        eps, momentum: as the reference's (momentum weighs the old running value: 0.9).
        compensation_start: the reference's fixed 1000 before gradient compensation may start.
        sync: statistics over the global batch across data-parallel processes (the reference: per process).
        exact_backward_warmup: a stated deviation (default off): the exact input gradient while
            ``it < warmup_iters``, for learning-rate ramps much faster than the reference's (module docstring).
    """

    def __init__(self, window_size: int | list[int] = 4, warmup_iters: int = 4000,
                 outlier_filtration: bool | None = None, eps: float = 1e-5, momentum: float = 0.9,
                 compensation_start: int = 1000, sync: bool = True, exact_backward_warmup: bool = False):
        sizes = [window_size] if isinstance(window_size, int) else list(window_size)
        if len(sizes) not in (1, 2) or not all(isinstance(s, int) and s >= 1 for s in sizes):
            raise ValueError(f"window_size must be a number of batches >= 1 or a pair [forward, backward], "
                             f"got {window_size!r}")
        for name, value in (("warmup_iters", warmup_iters), ("compensation_start", compensation_start)):
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a number of training iterations >= 0, got {value!r}")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum weighs the old running value and must lie in [0, 1), got {momentum}")
        self.window = sizes[0] if len(sizes) == 1 else (sizes[0], sizes[1])
        self.warmup_iters, self.outlier_filtration, self.eps = warmup_iters, outlier_filtration, eps
        self.momentum, self.compensation_start, self.sync = momentum, compensation_start, sync
        self.exact_backward_warmup = exact_backward_warmup

    def site(self, site: str, dim: int, layer: int | None, stack: StackInfo) -> nn.Module | None:
        if site not in SITES:
            return None
        filtration = self.outlier_filtration if self.outlier_filtration is not None else not stack.causal
        return UnifiedNorm(dim, self.window, self.warmup_iters, filtration, self.eps, self.momentum,
                           self.compensation_start, self.sync, self.exact_backward_warmup)
