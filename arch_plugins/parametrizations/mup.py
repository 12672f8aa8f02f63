"""Maximal update parametrization (muP) for Adam, and muP with the width-robust weight-decay rule.

Rules, in the form of Tensor Programs V's Table 8 as microsoft/mup (``MuAdam``, ``MuReadout``) and
EleutherAI/nanoGPT-mup implement it. Every matrix has its own width multiplier: its fan-in ratio r_in, its fan-in
over that of its twin in the same model built at the base shape (microsoft/mup's base shapes), so SwiGLU's
rounded hidden width gives ``mlp_out`` its own ratio; the head's is m_d = d_model / base_width:

- hidden matrices (``Kind.HIDDEN``: q, k, v, attention out, MLP in/gate/out, a plugin's hidden tokens): init
  variance divided by r_in (std by sqrt(r_in)) and Adam learning rate divided by r_in (a matrix whose fan-in
  does not grow, LAUREL's rank-r ``up``, keeps both);
- readouts inside the model (``Kind.READOUT``: fan-in grows, fan-out fixed; hyper-connections' dynamic
  alpha/beta, mHC's phi, AttnRes's queries, the attention gate): Adam learning rate divided by r_in and init std
  divided by r_in (an init already over sqrt(fan-in), ``init="fan_in"``, by sqrt(r_in)), which is
  ``MuReadout``'s 1/width multiplier moved into the weight;
- embeddings, head, gains, biases, scalars: init and learning rate unchanged;
- readout: the head's input multiplied by ``output_multiplier / m_d`` (``MuReadout``), so the logits of a
  bias-free head are;
- attention logits: 1/head_dim instead of 1/sqrt(head_dim), written sqrt(base_head_dim)/head_dim so the base
  shape's scale is SP's (microsoft/mup writes 8/d for d = 64).

Two init options from microsoft/mup's coordinate-check advice, off by default (nanoGPT-mup uses neither): a
zero-initialised query (attention starts uniform at every width) and a zero-initialised readout (the logits'
init part, which shrinks like 1/sqrt(width) under the readout multiplier, is gone).
"""

from __future__ import annotations

import math

from arch_plugins.declarations import OptimizerScale
from arch_plugins.interfaces import Kind, NormStrategy, Parametrization, ProjectionType, ResidualType, Role, StackInfo
from arch_plugins.parametrizations.base_shape import base_shape_head_dim, known_rules, positive, width_multiplier

MUP_RULES = ("hidden_init", "hidden_lr", "output_multiplier", "attention_scale", "readout")
# The two published muP conventions for AdamW's weight decay: they differ, so each has its name.
WEIGHT_DECAY_RULES = {
    # lambda as the recipe says: torch's AdamW then decays a hidden matrix by lr * lambda / r_in per step
    # (EleutherAI/nanoGPT-mup's master branch).
    "nanogpt_mup": "lambda unchanged (the decay per step, lr * lambda, shrinks as 1/r_in)",
    # lambda * r_in wherever the lr is divided by r_in, so lr * lambda is the same at every width
    # (microsoft/mup's MuAdamW with its default decoupled_wd=False multiplies lambda by the width multiplier).
    "mu_adamw": "lambda * r_in where the lr is / r_in (the decay per step, lr * lambda, is width-invariant)",
}


class MuP(Parametrization):
    """muP for Adam: hidden init and lr / m_d, readout / m_d, attention 1/head_dim (width transfer).

    Yang et al., "Tensor Programs V"; "Feature Learning in Infinite-Width Neural Networks":
    width transfer of the learning rate from a model of width ``base_width``.

    Options:
        base_width: the width the hyperparameters were tuned at (None: the model's own, i.e. SP's numbers
            except the attention rule, which is SP's at any base).
        base_head_dim: the head size at the base width (set it when heads are added at a fixed head size).
        base_heads: the number of heads at the base width (its head size is base_width / base_heads; set it when
            the model is widened at a fixed number of heads). With a base width, one of the two is required: the
            attention rule needs the base model's head size, which the target's head count does not give.
        output_multiplier: alpha_output, the readout's tunable constant (TP-V tunes it at the base shape).
        readout_zero_init: start the head at zero (microsoft/mup's ``readout_zero_init``), and every readout inside
            the model (``Kind.READOUT``: a gate's weight, mHC's phi; hyper-connections' and AttnRes's start at zero
            anyway), whose init part otherwise decays with width while its update does not (the attention gate's
            pre-activation change: slope -0.41 over widths 32-256 with muP's readout init, -0.04 from zero); an
            untied head only (a tied head is the embedding, which keeps its init: refused in one line).
        query_zero_init: start the query rows of the q|k|v projection at zero.
        without: rules to leave out (an ablation, as nanoGPT-mup's ``sp_with_mup_*`` scripts):
            ``hidden_init``, ``hidden_lr``, ``output_multiplier``, ``attention_scale``, ``readout`` (the
            readouts' init and lr: what they got when they were declared vectors).
        weight_decay_rule: ``nanogpt_mup`` (default: lambda unchanged) or ``mu_adamw`` (lambda * r_in where the lr
            is / r_in); see below.

    The init rules are applied in ``reinitialize``, once the whole model is built and each parameter's fan-in
    ratio is known (a matrix built from the stack's width-independent ``init_std`` is scaled by the whole rule).

    Weight decay follows one of two named rules (``weight_decay_rule``), because the two references differ:
    ``nanogpt_mup`` (the default) leaves lambda as the recipe says, so PyTorch's AdamW decays a hidden matrix by
    lr*lambda/r_in per step, as nanoGPT-mup's master branch does; ``mu_adamw`` multiplies lambda by r_in wherever
    the lr is divided by r_in, keeping lr*lambda width-invariant, as microsoft/mup's ``MuAdamW`` does by default
    (``decoupled_wd=False``). ``mup_wd`` and ``completep`` have weight-decay rules of their own.

    Composition: rules follow each parameter's kind and its own fan-in ratio, so a plugin's own parameters get
    the rule of the kind it declares (a gain-like ``Kind.VECTOR`` keeps the base lr; a readout-like
    ``Kind.READOUT`` gets the readout rules; a Pattention's key/value tokens are ``Kind.HIDDEN`` and get the
    hidden init and lr rules over their own fan-in, the value tokens' init being already over sqrt(fan-in)). The
    coord-check records every such parameter's pre-activation. A norm strategy's own attention
    scale (QK-norm variants) is multiplied by the same sqrt(base_head_dim/head_dim). Norm strategies that keep
    weights on the unit sphere (the hypersphere, nGPT) fix the weights' scale themselves: no muP rule is
    defined there, and the combination is refused. The embedding's input multiplier (TP-V's alpha_input) is
    not offered: it is 1.

    Muon: muP's multipliers are derived for Adam. On the hidden matrices Muon steps, ``mup`` declares the stated
    rule for Muon instead (Megatron-LM's PR 3715): no 1/m_d on Muon's lr or weight decay, and the spectral scale
    sqrt(fan_out / fan_in) of each matrix (Muon's ``adjust_lr: spectral``); the Adam rules above stay for
    everything Muon does not update. ``mup_wd`` and ``completep`` state no Muon rule (Muon refuses them).
    """

    rules = MUP_RULES
    needs_roles = True

    def __init__(self, base_width: int | None = None, base_head_dim: int | None = None,
                 output_multiplier: float = 1.0, readout_zero_init: bool = False, query_zero_init: bool = False,
                 without: list[str] | None = None, base_heads: int | None = None,
                 weight_decay_rule: str = "nanogpt_mup"):
        positive("base_width", base_width)
        if weight_decay_rule not in WEIGHT_DECAY_RULES:
            raise ValueError(f"weight_decay_rule must be one of {', '.join(WEIGHT_DECAY_RULES)} (nanogpt_mup: "
                             f"{WEIGHT_DECAY_RULES['nanogpt_mup']}; mu_adamw: {WEIGHT_DECAY_RULES['mu_adamw']}), "
                             f"got {weight_decay_rule!r}")
        self.weight_decay_rule = weight_decay_rule
        self.readout_zero_init, self.query_zero_init = bool(readout_zero_init), bool(query_zero_init)
        positive("base_head_dim", base_head_dim)
        positive("base_heads", base_heads)
        base_head_dim = base_shape_head_dim(base_width, base_head_dim, base_heads)
        if not output_multiplier > 0:
            raise ValueError(f"output_multiplier must be > 0, got {output_multiplier!r}")
        self.base_width, self.base_head_dim, self.alpha_output = base_width, base_head_dim, float(output_multiplier)
        self.without = known_rules(type(self).__name__, without or [], self.rules)

    def uses(self, rule: str) -> bool:
        return rule not in self.without

    def check(self, stack: StackInfo, *, norm: NormStrategy, residual: ResidualType,
              projection: ProjectionType) -> None:
        if any(norm.constrains(role) for role in ("q", "attn_out", "mlp_in", "mlp_out", "embedding", "head")):
            raise ValueError(f"{type(self).__name__} has no rule for a norm strategy that keeps weights on the unit "
                             f"sphere (nGPT's own scaling); use parametrization sp with that norm")

    def check_roles(self, roles: set[str], stack: StackInfo) -> None:
        if self.readout_zero_init and Role.HEAD not in roles:
            raise ValueError("readout_zero_init starts an untied head at zero, and this model has none (its head is "
                             "tied to the embedding, which keeps its init); drop readout_zero_init or untie the head "
                             "(tie_embeddings: false)")

    def m_d(self, stack: StackInfo) -> float:
        return width_multiplier(stack, self.base_width)

    def base_shape(self, stack: StackInfo) -> tuple[int, int] | None:
        if self.base_width is None or self.base_width == stack.d_model and self.base_head_dim == stack.head_dim:
            return None
        if self.base_width % self.base_head_dim:
            raise ValueError(f"base_width={self.base_width} is not a multiple of base_head_dim={self.base_head_dim}: "
                             f"the base model splits its width into heads of that size")
        return self.base_width, self.base_width // self.base_head_dim

    def init_scale(self, parameter) -> float:
        """What muP multiplies a parameter's built init by: 1/sqrt(r_in) for a hidden matrix, 1/r_in for a
        readout (1/sqrt(r_in) when its own init is already over sqrt(fan-in)); 1 for every other kind."""
        r = parameter.fan_in_ratio
        if parameter.kind == Kind.HIDDEN and self.uses("hidden_init"):
            return 1.0 if parameter.init == "fan_in" else r ** -0.5
        if parameter.kind == Kind.READOUT and self.uses("readout"):
            return r ** -0.5 if parameter.init == "fan_in" else 1.0 / r
        return 1.0

    def width_lr_rule(self, parameter) -> bool:
        """Whether muP has a width rule for this parameter's Adam learning rate (hidden matrices and readouts)."""
        return (parameter.kind == Kind.HIDDEN and self.uses("hidden_lr")
                or parameter.kind == Kind.READOUT and self.uses("readout"))

    def width_lr(self, parameter) -> float:
        """muP's Adam learning-rate multiplier for width: 1/r_in where it has a rule (``width_lr_rule``), else 1."""
        return 1.0 / parameter.fan_in_ratio if self.width_lr_rule(parameter) else 1.0

    def attention_multiplier(self, stack: StackInfo) -> float:
        if not self.uses("attention_scale"):
            return 1.0
        base = self.base_head_dim or stack.head_dim  # no base width: the model is its own base
        return math.sqrt(base / stack.head_dim)

    def output_multiplier(self, stack: StackInfo) -> float:
        if not self.uses("output_multiplier"):
            return 1.0
        return self.alpha_output / self.m_d(stack)

    def reinitialize(self, parameter, stack: StackInfo) -> None:
        if self.query_zero_init:
            for role, start, stop in parameter.slices or ((parameter.role, 0, parameter.param.shape[0]),):
                if role == Role.Q:
                    parameter.param[start:stop].zero_()
        if self.readout_zero_init and (parameter.role == Role.HEAD
                                       or parameter.kind == Kind.READOUT and self.uses("readout")):
            parameter.param.zero_()
        scale = self.init_scale(parameter)
        if scale != 1.0:
            parameter.param.mul_(scale)

    def optimizer_scale(self, parameter, stack: StackInfo, *, in_blocks: bool) -> OptimizerScale | None:
        if not self.width_lr_rule(parameter):
            return None
        lr = self.width_lr(parameter)
        return OptimizerScale(lr=lr, weight_decay=1.0 / lr if self.weight_decay_rule == "mu_adamw" else 1.0)

    def muon_scale(self, parameter, stack: StackInfo, *, in_blocks: bool) -> OptimizerScale | None:
        # The spectral rule is stated for muP's width rules only: a subclass that adds rules (mup_wd's weight decay,
        # CompleteP's depth rules) states none for Muon, which then refuses.
        if type(self).rules == MUP_RULES and parameter.kind == Kind.HIDDEN and self.uses("hidden_lr"):
            return OptimizerScale()
        return None


class MuPWeightDecay(MuP):
    """muP with Fan et al.'s weight decay: hidden lambda * m_d**0.5, vector-like parameters no decay.

    From "Robust Layerwise Scaling Rules by Proper Weight Decay
    Tuning" (arXiv 2510.15262): hidden (matrix-like) parameters keep muP's lr/m_d and get weight decay
    lambda * m_d**weight_decay_exponent; vector-like parameters (embeddings, head, gains, biases, scalars)
    train at the base lr (Theta(1)) with no weight decay. The paper's rule is lambda proportional to sqrt(d)
    (the exponent 0.5, the default), from matching the top singular value of each matrix across widths (with
    each matrix's own fan-in ratio for d);
    ``weight_decay_exponent: 1`` gives lambda proportional to d (lr*lambda constant in width: CompleteP's and
    "independent" decay). All of muP's options and rules apply (``without`` also takes ``weight_decay``).
    """

    rules = (*MUP_RULES, "weight_decay")

    def __init__(self, base_width: int | None = None, base_head_dim: int | None = None,
                 output_multiplier: float = 1.0, readout_zero_init: bool = False, query_zero_init: bool = False,
                 weight_decay_exponent: float = 0.5, without: list[str] | None = None, base_heads: int | None = None):
        super().__init__(base_width, base_head_dim, output_multiplier, readout_zero_init, query_zero_init, without,
                         base_heads)
        self.weight_decay_exponent = float(weight_decay_exponent)

    def optimizer_scale(self, parameter, stack: StackInfo, *, in_blocks: bool) -> OptimizerScale | None:
        lr = self.width_lr(parameter)
        if not self.uses("weight_decay"):
            return OptimizerScale(lr=lr)
        wd = parameter.fan_in_ratio ** self.weight_decay_exponent if parameter.kind == Kind.HIDDEN else 0.0
        return OptimizerScale(lr=lr, weight_decay=wd)
