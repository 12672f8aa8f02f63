"""CompleteP: muP in width plus depth transfer through a residual-branch multiplier L^-alpha."""

from __future__ import annotations

from arch_plugins.declarations import OptimizerScale
from arch_plugins.interfaces import Kind, NormStrategy, ProjectionType, ResidualType, StackInfo
from arch_plugins.parametrizations.base_shape import depth_multiplier, positive
from arch_plugins.parametrizations.mup import MUP_RULES, MuP

COMPLETEP_RULES = (*MUP_RULES, "branch_multiplier", "depth_lr", "eps", "weight_decay")


class CompleteP(MuP):
    """CompleteP: muP in width plus a residual-branch multiplier m_L^-alpha in depth (alpha = 1).

    CompleteP (Dey et al., "Don't be lazy: CompleteP enables compute-efficient deep transformers",
    arXiv 2505.01618), as EleutherAI/nanoGPT-mup's ``completep`` branch implements it, with width multiplier
    m_d = d_model / base_width and depth multiplier m_L = n_layers / base_depth:

    - every muP rule (``mup``): hidden init variance / m_d, readout output_multiplier / m_d, attention 1/d;
    - each sublayer's output is multiplied by m_L**-alpha before it joins the stream, and the matrices that
      write to the stream lose GPT-2's 1/sqrt(2 n_layers) init (the multiplier does that job);
    - Adam learning rate: hidden matrices lr * m_d**-1 * m_L**(alpha-1); gains, biases and scalars inside the
      blocks lr * m_L**(alpha-1); embeddings, the final norm and the head lr (at alpha = 1 all depth factors
      are 1);
    - weight decay of hidden matrices lambda * m_d (so lr*lambda does not change with width);
    - Adam epsilon eps * m_d**-1 * m_L**-alpha, for every parameter (the reference scales the optimizer's one
      epsilon).

    Options: those of ``mup``; ``base_depth`` (None:
    the model's own depth), ``alpha`` (1: CompleteP; 0.5: depth-muP; 0: no depth rule, the check must then fail);
    ``without`` leaves rules out (muP's and ``branch_multiplier``, ``depth_lr``, ``eps``, ``weight_decay``).

    Composition: the multiplier scales what the residual merge receives as the branch (after the sublayer's
    ``*_out`` site, so Peri-LN's output norm does not undo it); a merge with its own learned branch weights
    (LAUREL-RW's alpha, hyper-connections) multiplies them by it; a merge that would fuse its tail is not fused.
    CompleteP is derived for pre-norm stacks; post-norm's after-add norm rescales the stream whatever the
    multiplier (not refused; the depth check is what tells). The hypersphere is refused as under ``mup``.

    Refused, in one line, wherever the residual or the projection declares a depth-scaling conflict
    (``depth_scaling_conflict``): a term added to the stream beside the branch (LAUREL's low-rank and
    previous-activation terms, nGPT's -alpha*h) or a depth factor of the component's own (Pattention's 1/L value
    init). The paper's rule is that every per-layer change to the stream is a branch scaled by L^-alpha, with
    initialisations that do not follow depth; these pieces are not branches of that form, and the paper derives
    no rule for them. Decided from the declaration, not from the numbers, so the base depth (m_L = 1) is refused
    too and a depth ladder cannot pass its first rung and fail the next.
    """

    rules = COMPLETEP_RULES
    keeps_depth_scaled_init = False

    def __init__(self, base_width: int | None = None, base_depth: int | None = None, alpha: float = 1.0,
                 base_head_dim: int | None = None, output_multiplier: float = 1.0, readout_zero_init: bool = False,
                 query_zero_init: bool = False, without: list[str] | None = None, base_heads: int | None = None):
        super().__init__(base_width, base_head_dim, output_multiplier, readout_zero_init, query_zero_init, without,
                         base_heads)
        positive("base_depth", base_depth)
        if not 0 <= alpha <= 2:
            raise ValueError(f"alpha must be in [0, 2] (1: CompleteP, 0.5: depth-muP), got {alpha!r}")
        self.base_depth, self.alpha = base_depth, float(alpha)

    def check(self, stack: StackInfo, *, norm: NormStrategy, residual: ResidualType,
              projection: ProjectionType) -> None:
        super().check(stack, norm=norm, residual=residual, projection=projection)
        if not (self.uses("branch_multiplier") and self.alpha > 0):
            return  # no branch is depth-scaled: nothing to conflict with
        for component in (residual, projection):
            conflict = component.depth_scaling_conflict(stack)
            if conflict:
                raise ValueError(f"{type(self).__name__} multiplies each residual branch by L^-alpha and has no depth "
                                 f"rule for {conflict}, or drop the depth rule (parametrization mup)")

    def m_L(self, stack: StackInfo) -> float:
        return depth_multiplier(stack, self.base_depth)

    def branch_multiplier(self, stack: StackInfo) -> float:
        return self.m_L(stack) ** -self.alpha if self.uses("branch_multiplier") else 1.0

    def optimizer_scale(self, parameter, stack: StackInfo, *, in_blocks: bool) -> OptimizerScale | None:
        m_d, m_L = self.m_d(stack), self.m_L(stack)
        depth_lr = m_L ** (self.alpha - 1) if self.uses("depth_lr") else 1.0
        eps = 1.0 / m_d * m_L ** -self.alpha if self.uses("eps") else 1.0
        if parameter.kind == Kind.HIDDEN:
            lr = self.width_lr(parameter) * depth_lr  # 1/r_in: the matrix's own fan-in ratio
            wd = parameter.fan_in_ratio if self.uses("weight_decay") else 1.0
            return OptimizerScale(lr=lr, weight_decay=wd, eps=eps)
        if parameter.kind == Kind.READOUT:
            return OptimizerScale(lr=self.width_lr(parameter) * (depth_lr if in_blocks else 1.0), eps=eps)
        if in_blocks:
            return OptimizerScale(lr=depth_lr, eps=eps)
        return OptimizerScale(eps=eps)
