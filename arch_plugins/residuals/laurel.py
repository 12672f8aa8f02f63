"""LAUREL, Learned Augmented Residual Layer (Menghani, Kumar, Kumar; ICML 2025): RW, LR, PA and their combinations.

One form covers every variant. Around a function f of the stream x_i (a sublayer, or a whole block)::

    x_{i+1} = alpha * f(x_i) + beta * g,    g = sum_{j<k} gamma_j * (x_{i-j} + B_j A_j x_{i-j})

- RW (residual weights): alpha, beta learned and bounded; without RW they are fixed at 1.
- LR (low rank): the B_j A_j terms, A (d -> r) with the paper's structured init, B (r -> d) zero;
  without LR they are absent.
- PA (previous activations): k > 1 earlier streams, gamma learned, initialised (1, 0, ..., 0);
  without PA, k = 1 and gamma_0 = 1 is fixed.

This is the paper's formula for RW, LR, RW+LR and RW+PA. For PA alone the paper writes
``f(x_i) + x_i + sum_j gamma'_j x_{i-j}``, the same family with gamma_0 = 1 + gamma'_0. At init every
variant is the plain residual x_i + f(x_i) (B = 0, gamma = (1, 0, ...), alpha = beta = 1).

RW+LR+PA has its own equation in the paper (arXiv 2411.07501v4, eq. (6)), which is not the general form
above: the earlier streams enter only through their low-rank products, and x_i is carried with a fixed
coefficient 1::

    x_{i+1} = alpha * f(x_i) + beta * (x_i + sum_{j<k} gamma_j * B_j A_j x_{i-j})       (combination="eq6")

That is the default of ``laurel_rw_lr_pa``, with gamma initialised to 1 (the paper gives no init; with
gamma_j = 0 and B_j = 0 neither would ever get a gradient). B = 0 still makes it the plain residual at init.
``combination="legacy"`` keeps this project's earlier reading, the general form above with h_j = I + B_j A_j
(identity paths gamma_j x_{i-j} and a learned gamma_0 on x_i, gamma = (1, 0, ...)): the two are equal at
init but learn different function families.

Where LAUREL sits (``placement``): ``block`` (default) wraps each transformer block once, f being
the block's two sublayers with their inner plain residual, x_i the block's input: the paper's LLM
parameter count (2N(4D + 1) for N layers, rank 4) implies one instance per layer. ``sublayer`` wraps
attention and MLP separately, twice the instances.

The paper gives no parametrisation of alpha and beta, only that a softmax or a sigmoid must bound
them. Here (alpha, beta) = 2 * softmax(a, b) (default; the two share a budget of 2, so RW reweights
f against the carry but cannot inflate the stream) or alpha = 2 * sigmoid(a), beta = 2 * sigmoid(b)
(independent, each in (0, 2)), with a = b = 0 at init: the factor 2 makes both exactly 1 there.
"""

from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from arch_plugins.autocast import autocast_dtype
from arch_plugins.declarations import declare_diagnostic, declare_role, declare_roles
from arch_plugins.init_identity import InitIdentity
from arch_plugins.interfaces import Kind, ResidualHistory, ResidualMerge, ResidualType, StackInfo
from arch_plugins.registry import PluginError
from arch_plugins.residuals.add import Add

WEIGHTINGS = ("softmax", "sigmoid")
A_INITS = ("structured", "xavier")
PLACEMENTS = ("block", "sublayer")
COMBINATIONS = ("eq6", "legacy")


class LowRank(nn.Module):
    """x -> B(A x), rank r: A (down, d -> r) initialised as the paper's LLMs, B (up, r -> d) zero."""

    def __init__(self, dim: int, rank: int, a_init: str):
        super().__init__()
        self.down = nn.Linear(dim, rank, bias=False)
        self.up = nn.Linear(rank, dim, bias=False)
        with torch.no_grad():
            if a_init == "structured":
                # The paper's "column orthogonal" init: A[i, j] = 1/sqrt(r d) if i mod r == j, so each of
                # the r outputs sums a disjoint comb of the d inputs.
                self.down.weight.zero_()
                channels = torch.arange(dim)
                self.down.weight[channels % rank, channels] = 1.0 / math.sqrt(rank * dim)
            else:  # xavier: the paper's ResNet init
                nn.init.xavier_uniform_(self.down.weight)
            self.up.weight.zero_()
        # Hidden-kind, each with its own fan-in ratio under a width parametrization: down (d -> r) reads the width
        # (lr / r_in; its init is already over sqrt(d)), up (r -> d) reads the fixed rank (ratio 1: muP's Θ(1) lr).
        # Not Kind.READOUT: a zero start for down (readout_zero_init) with up at zero would leave both without
        # a gradient.
        declare_role(self.down, "weight", "laurel_down", kind=Kind.HIDDEN, group="residual", init="fan_in")
        declare_role(self.up, "weight", "laurel_up", kind=Kind.HIDDEN, group="residual")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(self.down(x))


class LaurelMerge(ResidualMerge):
    """One LAUREL instance: x_{i+1} = alpha f(x_i) + beta sum_j gamma_j (x_{i-j} + B_j A_j x_{i-j})."""

    def __init__(self, dim: int, *, wraps_block: bool, weights: str | None, rank: int | None,
                 gammas: int | None, a_init: str, combination: str = "legacy"):
        super().__init__()
        self.wraps_block, self.weights = wraps_block, weights
        # eq6: the earlier streams enter only through gamma_j B_j A_j, x_i with coefficient 1 (paper eq. (6)).
        self.eq6 = combination == "eq6"
        # RW: logits of (alpha, beta).
        self.rw_logits = nn.Parameter(torch.zeros(2)) if weights is not None else None
        # PA: one gamma per earlier stream that exists at this depth (the first layers see fewer than k).
        self.gamma = None
        if gammas is not None:
            self.gamma = nn.Parameter(torch.ones(gammas) if self.eq6 else torch.zeros(gammas))
            with torch.no_grad():
                self.gamma[0] = 1.0
        declare_roles(self, {"rw_logits": "laurel_weights", "gamma": "laurel_gamma"}, kind=Kind.SCALAR,
                      group="residual")
        terms = gammas or 1
        self.low_rank = nn.ModuleList(LowRank(dim, rank, a_init) for _ in range(terms)) if rank else None
        # The effective weights, not their logits: alpha and beta as the merge uses them, each gamma_j apart.
        if self.rw_logits is not None:
            declare_diagnostic(self, "alpha", partial(_alpha_beta, index=0))
            declare_diagnostic(self, "beta", partial(_alpha_beta, index=1))
        for j in range(gammas or 0):
            declare_diagnostic(self, f"gamma{j}", partial(_gamma, index=j))

    def alpha_beta(self) -> torch.Tensor:
        if self.weights == "softmax":
            return 2 * torch.softmax(self.rw_logits, dim=0)
        return 2 * torch.sigmoid(self.rw_logits)

    def forward(self, h: torch.Tensor, branch: torch.Tensor, history: ResidualHistory) -> torch.Tensor:
        # x_i, x_{i-1}, ...: the streams entering this block and the ones before (block placement),
        # or the stream entering this sublayer and those entering the previous ones (sublayer placement).
        earlier = history.block_inputs if self.wraps_block else history.states
        x_i = earlier[-1] if self.wraps_block else h
        terms = self.gamma.shape[0] if self.gamma is not None else 1
        xs = [x_i] + [earlier[-1 - j] for j in range(1, terms)]
        alpha, beta = self.alpha_beta() if self.rw_logits is not None else (None, None)
        # The docstring's formula as one expression, each scalar folded into a small tensor or a coefficient:
        #   out = low_rank + base + k_0 x_i + sum_{j>0} k_j x_{i-j}
        # base: alpha (h + branch) around a block (f(x_i) = h - x_i + branch, so alpha f + beta x_i is
        # alpha (h + branch) + (beta - alpha) x_i, without the subtraction), alpha branch around a sublayer
        # (x_i is h), h + branch without RW. No zeros accumulator: at init every coefficient below is exactly
        # 0 or 1 and the low-rank term exactly 0, so LR and PA are `add` bit for bit, as before.
        out = self._low_rank(xs, beta)
        if alpha is None:
            out = h + branch if out is None else out + h + branch
        else:
            base = h + branch if self.wraps_block else branch
            out = base * alpha if out is None else out + base * alpha
        identity = self.gamma is not None and not self.eq6  # legacy PA: gamma_j on x_{i-j}'s identity path
        for j, x in enumerate(xs):
            if not identity and j > 0:
                break  # eq6, RW and LR carry x_i alone
            carried = self.gamma[j] if identity else None  # x_{i-j}'s coefficient in g (None: 1)
            if alpha is None:  # h + branch already holds x_i once
                coefficient = (carried - 1.0 if j == 0 else carried) if carried is not None else None
            else:
                coefficient = beta if carried is None else carried * beta
                if j == 0 and self.wraps_block:
                    coefficient = coefficient - alpha
            if coefficient is not None:
                out = out + x * coefficient
        return out

    def _low_rank(self, xs: list[torch.Tensor], beta: torch.Tensor | None) -> torch.Tensor | None:
        """beta sum_j gamma_j B_j A_j x_{i-j} as one up-GEMM: K = terms x rank over the down projections side by
        side, against [B_0 B_1 ...] with each B_j's columns scaled by beta gamma_j (a (d, rank) multiply, where
        scaling the activations would cost a (tokens, rank) one and a cast); None without LR."""
        if self.low_rank is None:
            return None
        scale = self.gamma
        if beta is not None:
            scale = beta if scale is None else scale * beta
        if len(xs) == 1:
            # One term: autograd's backward of F.linear already hands each weight its gradient in its own layout
            # (mm's backward follows the weight's strides), and there is no stack to walk back.
            down, up = F.linear(xs[0], self.low_rank[0].down.weight), self.low_rank[0].up.weight
            if scale is not None:
                up = up * scale
            return F.linear(down, up)
        return _LowRankSum.apply(scale, len(xs), *xs, *(lr.down.weight for lr in self.low_rank),
                                 *(lr.up.weight for lr in self.low_rank))


class _LowRankSum(torch.autograd.Function):
    """``sum_j s_j B_j A_j x_j`` over k >= 2 streams: the down projections as one batched GEMM over the stacked
    streams, the up projections as one GEMM (K = k x rank against [s_0 B_0, s_1 B_1, ...]), in autocast's dtype
    when autocast is on, as F.linear and bmm would cast; the backward written out.

    Why written out: autograd's backward of the same forward hands every A_j and B_j a strided slice of one
    gradient (the batched GEMM's gradient of the A^T it read, a column block of the wide GEMM's), which
    AccumulateGrad copies apart, two ops a parameter, and it walks each view and reshape of the forward back one
    op at a time. Here the weights' gradients come out of batched GEMMs in the parameters' own layouts, (k, rank, d)
    and (k, d, rank), so each parameter's is a plain slice; the streams' come out in theirs. The same GEMM FLOPs
    and the same tensors saved for backward as autograd saved (the streams and weights in the compute dtype, the
    down activations, the unscaled B for the scales' gradient). At 124M, RW+LR+PA: 3,399 -> 3,107 ops per step.
    """

    @staticmethod
    def forward(ctx, scale: torch.Tensor, count: int, *tensors: torch.Tensor) -> torch.Tensor:
        streams, downs, ups = tensors[:count], tensors[count:2 * count], tensors[2 * count:]
        device = streams[0].device.type
        # The casts autocast would make inside bmm and mm, made here so that backward has what the GEMMs read.
        dtype = autocast_dtype(device) or streams[0].dtype
        stacked = torch.stack(streams)  # (k, ..., d)
        x = stacked.view(count, -1, stacked.shape[-1]).to(dtype)  # (k, tokens, d)
        a = torch.stack(downs).to(dtype)  # (k, rank, d)
        lows = torch.bmm(x, a.mT)  # (k, tokens, rank): A_j x_j
        b = torch.stack(ups, dim=1)  # (d, k, rank)
        up = (b * scale.view(count, 1)).view(b.shape[0], -1).to(dtype)  # (d, k x rank)
        low = lows.transpose(0, 1).reshape(lows.shape[1], -1)  # (tokens, k x rank)
        ctx.save_for_backward(scale, x, a, lows, b, up)
        ctx.dtypes = stacked.dtype, downs[0].dtype
        return torch.mm(low, up.t()).view(streams[0].shape)

    @staticmethod
    @once_differentiable  # the saved tensors carry no graph: a second derivative would be wrong
    def backward(ctx, grad_out: torch.Tensor):
        scale, x, a, lows, b, up = ctx.saved_tensors
        stream_dtype, weight_dtype = ctx.dtypes
        count, tokens = lows.shape[:2]
        needs = ctx.needs_input_grad  # scale, count, the k streams, the k A_j, the k B_j
        grad = grad_out.reshape(tokens, -1)  # (tokens, d)
        grad_streams = grad_downs = grad_ups = (None,) * count
        grad_scale = None
        if any(needs[2:2 * count + 2]):
            # K is term-major, so each term's (tokens, rank) block is a strided matrix the batched GEMMs read in place.
            grad_lows = torch.mm(grad, up).view(tokens, count, -1).transpose(0, 1)  # (k, tokens, rank)
            if any(needs[2:count + 2]):
                grad_x = torch.bmm(grad_lows, a).to(stream_dtype)  # (k, tokens, d)
                grad_streams = grad_x.view(count, *grad_out.shape).unbind(0)
            if any(needs[count + 2:2 * count + 2]):
                grad_downs = torch.bmm(grad_lows.mT, x).to(weight_dtype).unbind(0)  # (k, rank, d)
        if needs[0] or any(needs[2 * count + 2:]):
            # s_j B_j's gradient, (k, d, rank): a batched GEMM against the one gradient broadcast over the terms
            # (an expand, no copy), where one (d, tokens) x (tokens, k x rank) product would give column blocks.
            grad_up = torch.bmm(grad.t().expand(count, -1, -1), lows).to(weight_dtype)
            grad_ups = (grad_up * scale.view(count, 1, 1)).unbind(0)
            grad_scale = (grad_up * b.transpose(0, 1)).sum((1, 2))
        return grad_scale, None, *grad_streams, *grad_downs, *grad_ups


def _alpha_beta(merge: LaurelMerge, index: int) -> torch.Tensor:
    return merge.alpha_beta()[index]


def _gamma(merge: LaurelMerge, index: int) -> torch.Tensor:
    return merge.gamma[index]


class LaurelResidual(ResidualType):
    """LAUREL with any combination of RW, LR and PA (the named variants below fix which)."""

    def __init__(self, *, weights: str | None = None, rank: int | None = None, previous: int | None = None,
                 a_init: str = "structured", placement: str = "block", combination: str = "legacy"):
        if weights is not None and weights not in WEIGHTINGS:
            raise ValueError(f"weights bounds alpha and beta: give 'softmax' or 'sigmoid', got {weights!r}")
        if rank is not None and (not isinstance(rank, int) or rank < 1):
            raise ValueError(f"rank must be a positive integer (at most d_model), got {rank!r}")
        if previous is not None and (not isinstance(previous, int) or previous < 1):
            raise ValueError(f"previous is how many streams PA reads (k, the paper uses 3); give an integer >= 1, "
                             f"got {previous!r}")
        if a_init not in A_INITS:
            raise ValueError(f"a_init must be 'structured' (the paper's LLMs) or 'xavier' (its ResNet), got {a_init!r}")
        if placement not in PLACEMENTS:
            raise ValueError(f"placement must be 'block' (once per transformer block) or 'sublayer' "
                             f"(around attention and MLP each), got {placement!r}")
        if combination not in COMBINATIONS:
            raise ValueError(f"combination must be 'eq6' (the paper's RW+LR+PA: x_i + sum_j gamma_j B_j A_j x_(i-j)) "
                             f"or 'legacy' (sum_j gamma_j (I + B_j A_j) x_(i-j)), got {combination!r}")
        if combination == "eq6" and (rank is None or previous is None):
            raise ValueError("combination 'eq6' needs both rank (LR) and previous (PA)")
        self.weights, self.rank, self.previous, self.a_init, self.placement = weights, rank, previous, a_init, placement
        self.combination = combination

    def depth_scaling_conflict(self, stack: StackInfo) -> str | None:
        # alpha multiplies f, which holds the branch as the block hands it over (already depth-scaled), and beta the
        # carry; the low-rank and previous-activation terms are added beside the branch, once per layer.
        terms = [what for what, on in (("low-rank terms B A x", self.rank),
                                       ("previous-activation terms gamma_j x_(i-j)", self.previous)) if on is not None]
        if not terms:
            return None
        return (f"LAUREL's {' and '.join(terms)}, added to the stream beside the branch at every layer: "
                f"use residual laurel_rw or add")

    def reads_history(self, stack: StackInfo) -> bool:
        # Block placement reads the stream entering the block (x_i); PA reads the earlier ones.
        return self.placement == "block" or self.previous is not None

    def merge(self, sublayer: str, layer: int, stack: StackInfo) -> ResidualMerge:
        wraps_block = self.placement == "block"
        if wraps_block and sublayer == "attn":
            return Add()  # the block's inner residual; LAUREL acts at the MLP merge, where the block ends
        if self.rank is not None and self.rank > stack.d_model:
            raise PluginError(f"LAUREL rank {self.rank} exceeds d_model {stack.d_model}; "
                              f"set residual_options.rank to at most {stack.d_model}")
        gammas = None
        if self.previous is not None:
            # Streams that exist at this depth: one per block entered, or the embedding plus one per sublayer.
            available = layer + 1 if wraps_block else 2 * layer + (1 if sublayer == "attn" else 2)
            gammas = min(self.previous, available)
        return LaurelMerge(stack.d_model, wraps_block=wraps_block, weights=self.weights, rank=self.rank,
                           gammas=gammas, a_init=self.a_init, combination=self.combination)


class LaurelRW(LaurelResidual):
    """LAUREL-RW: alpha f(x) + beta x, (alpha, beta) = 2 softmax(a, b) by default; 2 parameters per instance.

    Args:
        weights: ``softmax`` (alpha + beta = 2) or ``sigmoid`` (each 2 sigmoid, independent).
        placement: ``block`` (once per transformer block) or ``sublayer``.
    """

    # alpha = beta = 1 at init. Around a sublayer that is the float sum `add` takes; around a block the branch is
    # rebuilt from the stream, (h - x) + y, so only rounding separates them.
    init_identities = (InitIdentity("add", {"placement": "sublayer"}), InitIdentity("add", exact=False))

    def __init__(self, weights: str = "softmax", placement: str = "block"):
        super().__init__(weights=weights, placement=placement)


class LaurelLR(LaurelResidual):
    """LAUREL-LR: f(x) + x + B A x, rank r (32), A structured, B zero: exactly `add` at init.

    Args:
        rank: r, the paper's small-LLM ablation value by default.
        a_init: ``structured`` (the paper's LLMs) or ``xavier`` (its ResNet).
        placement: ``block`` (once per transformer block) or ``sublayer``.
    """

    # The up-projection B starts at zero, so the low-rank term adds nothing, whatever A's init or the placement.
    init_identities = (InitIdentity("add"), InitIdentity("add", {"placement": "sublayer", "a_init": "xavier"}))

    def __init__(self, rank: int = 32, a_init: str = "structured", placement: str = "block"):
        super().__init__(rank=rank, a_init=a_init, placement=placement)


class LaurelPA(LaurelResidual):
    """LAUREL-PA: f(x_i) + sum_j gamma_j h_j(x_{i-j}) over the last k = 3 streams, gamma = (1, 0, 0): `add` at init.

    Args:
        previous: k, how many streams (this one and earlier ones) the carry mixes.
        rank: None for identity h_j; a rank r for h_j = I + B_j A_j (B zero).
        a_init: init of the A_j when ``rank`` is set.
        placement: ``block`` (once per transformer block) or ``sublayer``.
    """

    # gamma starts at (1, 0, ...) and every B_j at zero: the carry is the current stream alone, as in `add`.
    init_identities = (InitIdentity("add"), InitIdentity("add", {"placement": "sublayer", "rank": 4}))

    def __init__(self, previous: int = 3, rank: int | None = None, a_init: str = "structured",
                 placement: str = "block"):
        super().__init__(previous=previous, rank=rank, a_init=a_init, placement=placement)


class LaurelRWLR(LaurelResidual):
    """LAUREL-RW+LR: alpha f(x) + beta (x + B A x), the paper's LLM-1B/4B choice.

    Args:
        weights: ``softmax`` or ``sigmoid`` (see laurel_rw).
        rank: r (the paper: 4 at 1B, 64 at 4B, 32 in its small-LLM ablation).
        a_init: ``structured`` or ``xavier``.
        placement: ``block`` or ``sublayer``.
    """

    # alpha = beta = 1 at init. Around a sublayer that is the float sum `add` takes; around a block the branch is
    # rebuilt from the stream, (h - x) + y, so only rounding separates them.
    init_identities = (InitIdentity("add", {"placement": "sublayer"}), InitIdentity("add", exact=False))

    def __init__(self, weights: str = "softmax", rank: int = 32, a_init: str = "structured",
                 placement: str = "block"):
        super().__init__(weights=weights, rank=rank, a_init=a_init, placement=placement)


class LaurelRWLRPA(LaurelResidual):
    """LAUREL-RW+LR+PA: alpha f(x_i) + beta (x_i + sum_j gamma_j B_j A_j x_{i-j}), eq. (6), the paper's best small LLM.

    Args:
        weights: ``softmax`` or ``sigmoid`` (see laurel_rw).
        rank: r of each B_j A_j.
        previous: k.
        a_init: ``structured`` or ``xavier``.
        placement: ``block`` or ``sublayer``.
        combination: ``eq6`` (the paper's eq. (6), gamma init 1) or ``legacy``
            (alpha f + beta sum_j gamma_j (I + B_j A_j) x_{i-j}, gamma init (1, 0, ...)).
    """

    # alpha = beta = 1 at init. Around a sublayer that is the float sum `add` takes; around a block the branch is
    # rebuilt from the stream, (h - x) + y, so only rounding separates them.
    init_identities = (InitIdentity("add", {"placement": "sublayer"}), InitIdentity("add", exact=False))

    def __init__(self, weights: str = "softmax", rank: int = 32, previous: int = 3, a_init: str = "structured",
                 placement: str = "block", combination: str = "eq6"):
        super().__init__(weights=weights, rank=rank, previous=previous, a_init=a_init, placement=placement,
                         combination=combination)
