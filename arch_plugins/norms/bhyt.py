"""BHyT, Bounded Hyperbolic Tangent (Byun et al., arXiv 2601.09719; code MLAI-Yonsei/BHyT).

Both pre-norm sites of a block become ``gamma * tanh(lambda * x / (kappa * rms))``. The attention input
uses its exact rms; the MLP input does not reduce over its input h at all: its variance is approximated as
the attention input's mean square plus what attention adds under near-uniform attention,

    var2 = mean(x^2) + c_attn * lambda_in^2 / kappa^2,     c_attn = ||W_V^T W_O^T||_F^2 / (T d)

(``models/hf_src/llama/modeling_llama.py``: ``LayerWiseVarApproxParrallel``, ``update_scaler``), with
c_attn recomputed from the weights, without gradient, every ``max(1, min(1000, max_steps // 50))`` steps
(``src/llamafactory/train/callbacks.py``, ``UpdateScalerCallback``) and at the first forward pass.
"""

from __future__ import annotations

import torch
from torch import nn

from arch_plugins.declarations import (
    TrainingProgress,
    declare_diagnostic,
    declare_progress_hook,
    declare_role,
    dense_role,
    dense_weight,
)
from arch_plugins.interfaces import Kind, NormStrategy, Role, Site, StackInfo
from arch_plugins.registry import PluginError

EPS = 1e-6  # the reference's epsilon inside every rsqrt (hard-coded there)
# The reference callback's interval when the run's length is unknown: max_steps taken as 25000.
UNKNOWN_RUN_STEPS = 25000


def refresh_interval(total_steps: int | None) -> int:
    """Steps between two recomputations of c_attn: about 50 per run, at least 1, at most 1000."""
    total = total_steps if total_steps else UNKNOWN_RUN_STEPS
    return max(1, min(1000, total // 50))


class BoundedTanh(nn.Module):
    """What both BHyT layers share in ``gamma * tanh(lambda * x * rstd)``: lambda (learned or fixed), gamma, 1/kappa."""

    def __init__(self, dim: int, lam: float, kappa: float, learnable_lam: bool):
        super().__init__()
        self.inv_kappa = 1.0 / kappa
        lam_t = torch.full((1,), float(lam))
        if learnable_lam:
            self.lam = nn.Parameter(lam_t)
        else:
            self.register_buffer("lam", lam_t)
        self.weight = nn.Parameter(torch.ones(dim))
        declare_role(self, "weight", Role.GAIN)
        if learnable_lam:
            declare_role(self, "lam", "bhyt_lambda", kind=Kind.SCALAR, group="norms")
        declare_diagnostic(self, "lam")


class BHyTExact(BoundedTanh):
    """``gamma * tanh(lambda * x * rsqrt(mean(x^2) + eps) / kappa)``: BHyT with the exact statistic (BHyT*).

    At the attention input it keeps the mean square it computed (``last_mean_square``) for the MLP input
    of the same block, which approximates its own variance from it instead of reducing again.
    """

    def __init__(self, dim: int, lam: float, kappa: float, learnable_lam: bool = True):
        super().__init__(dim, lam, kappa, learnable_lam)
        self.last_mean_square: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean_square = x.float().square().mean(dim=-1, keepdim=True)
        self.last_mean_square = mean_square
        rstd = (torch.rsqrt(mean_square + EPS) * self.inv_kappa).to(x.dtype)
        return self.weight * torch.tanh(self.lam * rstd * x)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, kappa={1 / self.inv_kappa:g}"


class BHyTApproximate(BoundedTanh):
    """BHyT at the MLP input with the reference's variance approximation (no reduction over its input).

    ``c_attn`` is a persistent buffer: a resumed run continues with the value the interrupted run last
    computed. (The reference keeps it out of checkpoints and recomputes it at the first forward pass after
    loading, so a resumed run there differs from an uninterrupted one until the next refresh.)
    """

    def __init__(self, dim: int, lam: float, kappa: float, attn_input: BHyTExact, learnable_lam: bool = True,
                 every: int | None = None):
        super().__init__(dim, lam, kappa, learnable_lam)
        self.register_buffer("c_attn", torch.zeros(()))
        self.every = every
        # Plain references (not submodules): the attention input's site and the block's W_V / W_O owners
        # belong to the block; registering them here would duplicate them in the state dict.
        object.__setattr__(self, "attn_input", attn_input)
        object.__setattr__(self, "value_rows", None)
        object.__setattr__(self, "output_rows", None)
        self.stale = True  # recompute c_attn at the next forward pass (the reference: at the first one)
        self.refreshes = 0  # how many times c_attn was recomputed (tests read it)
        declare_diagnostic(self, "c_attn")
        declare_progress_hook(self, BHyTApproximate.on_progress)

    def bind(self, value_rows: tuple[nn.Module, int, int], output_rows: tuple[nn.Module, int, int]) -> None:
        object.__setattr__(self, "value_rows", value_rows)
        object.__setattr__(self, "output_rows", output_rows)

    def on_progress(self, progress: TrainingProgress) -> None:
        every = self.every if self.every else refresh_interval(progress.total_steps)
        if progress.step % every == 0:
            # Computed at the next forward pass, where FSDP2 has gathered the block's weights.
            self.stale = True

    @torch.no_grad()
    def refresh(self, tokens: int) -> None:
        """c_attn = ||W_V^T W_O^T||_F^2 / (T d) from the weights as they are now."""
        w_v = dense_weight(self.value_rows).float()   # (d_v, d): value rows of the fused q|k|v
        w_o = dense_weight(self.output_rows).float()  # (d, d_v)
        combined = w_v.T @ w_o.T
        self.c_attn.copy_(combined.square().sum() / (tokens * w_v.shape[1]))
        self.stale = False
        self.refreshes += 1

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.stale:
            self.refresh(h.shape[-2])
        mean_square = self.attn_input.last_mean_square
        if mean_square is None:
            raise RuntimeError("BHyT's MLP input ran before its attention input in this block")
        lam_in = self.attn_input.lam.detach().float()
        variance = mean_square + self.c_attn * lam_in.square() * self.inv_kappa ** 2
        rstd = (torch.rsqrt(variance + EPS) * self.inv_kappa).to(h.dtype)
        return self.weight * torch.tanh(self.lam * rstd * h)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        if prefix + "c_attn" in state_dict:
            self.stale = False  # a loaded value is kept until the schedule says otherwise


class BHyTStrategy(NormStrategy):
    """BHyT: tanh-bounded pre-norm, exact rms at the attention input, approximated at the MLP input.

    Defaults are the official sweep's first setting (``scripts/bhyt/pt_bhyt_sweep.sh``: lambda_in 2.0,
    lambda_post 1.0, final 0.0 -> RMSNorm before the head), kappa 10 (``bhyt_kappa``), learnable lambdas,
    gains initialised to 1.

    Args:
        lam_in: initial lambda of the attention-input BHyT.
        lam_post: initial lambda of the MLP-input BHyT.
        final_lam: > 0: an exact BHyT before the head with this initial lambda; 0: RMSNorm (as the reference).
        kappa: the bound's constant (Chebyshev p = 1 - 1/kappa^2).
        learnable_lam: learn the lambdas.
        exact: the exact statistic at both sites (the reference's ``bhytstar``), no approximation.
        refresh_every: steps between recomputations of c_attn; None: the reference's
            ``max(1, min(1000, total_steps // 50))``.
        final_eps: epsilon of the final RMSNorm.
    """

    def __init__(self, lam_in: float = 2.0, lam_post: float = 1.0, final_lam: float = 0.0, kappa: float = 10.0,
                 learnable_lam: bool = True, exact: bool = False, refresh_every: int | None = None,
                 final_eps: float = 1e-5):
        if kappa <= 0:
            raise ValueError(f"kappa must be positive, got {kappa}")
        if refresh_every is not None and refresh_every < 1:
            raise ValueError(f"refresh_every must be at least 1, got {refresh_every}")
        self.lam_in, self.lam_post, self.final_lam, self.kappa = lam_in, lam_post, final_lam, kappa
        self.learnable_lam, self.exact, self.refresh_every, self.final_eps = (learnable_lam, exact, refresh_every,
                                                                              final_eps)
        self._attn_inputs: dict[int, BHyTExact] = {}
        self._mlp_inputs: dict[int, BHyTApproximate] = {}

    def site(self, site: str, dim: int, layer: int | None, stack: StackInfo) -> nn.Module | None:
        if site == Site.ATTN_IN:
            module = BHyTExact(dim, self.lam_in, self.kappa, self.learnable_lam)
            self._attn_inputs[layer] = module
            return module
        if site == Site.MLP_IN:
            if self.exact:
                return BHyTExact(dim, self.lam_post, self.kappa, self.learnable_lam)
            if layer not in self._attn_inputs:
                raise PluginError("bhyt's MLP input needs the attention input of its block, built first")
            module = BHyTApproximate(dim, self.lam_post, self.kappa, self._attn_inputs[layer], self.learnable_lam,
                                     self.refresh_every)
            self._mlp_inputs[layer] = module
            return module
        if site == Site.FINAL:
            if self.final_lam > 0:
                return BHyTExact(dim, self.final_lam, self.kappa, learnable_lam=True)
            return nn.RMSNorm(dim, eps=self.final_eps)
        return None

    def bind(self, layer: int, block: nn.Module, stack: StackInfo) -> None:
        approx = self._mlp_inputs.pop(layer, None)
        self._attn_inputs.pop(layer, None)
        if approx is None:
            return
        value, output = dense_role(block, Role.V), dense_role(block, Role.ATTN_OUT)
        if value is None or output is None:
            raise PluginError("bhyt's variance approximation reads W_V and W_O as matrices, and this block's "
                              "projection has none (e.g. pattention); use norm_options.exact=true")
        approx.bind(value, output)
