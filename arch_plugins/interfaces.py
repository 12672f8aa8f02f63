"""The plugin kinds and the contract each one signs with the transformer block.

The block calls every hook below unconditionally; a plugin returns ``None`` (identity) where it does
not act. That is what lets the block name no plugin: a new component is a new subclass here, never a
new branch in the block. The hooks were chosen for the whole zoo the project targets (pre/post/peri
norms, layer-dependent norms, nGPT's hypersphere, LAUREL and other multi-state residuals,
TokenFormer's Pattention), not only for the built-ins.

Besides the hooks, a component tells the outside world what it needs or offers through declarations, all
in ``arch_plugins.declarations`` (whose docstring lists every one): each parameter's role, weight-decay
exceptions, weights kept on the unit sphere, learned scalars worth watching, and behaviour that follows the
step count. A module calls them on itself in ``__init__``, so neither the block nor any callback names it::

    class MyNorm(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(dim))
            self.alpha = nn.Parameter(torch.ones(1))
            declare_role(self, "weight", Role.GAIN)
            declare_role(self, "alpha", "my_alpha", kind=Kind.SCALAR)   # a plugin's own role
            declare_diagnostic(self, "alpha")                           # watched during training

Pure PyTorch: nothing here knows about Lightning.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from arch_plugins.errors import PluginError


@dataclass(frozen=True)
class StackInfo:
    """What a plugin may know about the stack it is built into."""

    d_model: int
    num_layers: int
    num_heads: int
    mlp_hidden: int
    causal: bool  # True for a language model, False for an encoder such as ViT

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads


class Site:
    """Every place where a transformer controls activation scale.

    Per block, for each sublayer ``s`` in (attn, mlp), the block computes::

        x   = merge.branch_input(h, history)
        y   = s_out(sublayer(s_in(x)))
        h   = s_after_add(merge(h, y, history))

    so pre-norm lives at ``*_in``, Peri-LN adds ``*_out``, post-norm and nGPT's re-normalisation of
    the stream live at ``*_after_add``. Model-level sites wrap the whole stack.
    """

    EMBEDDING = "embedding"  # after token/patch embedding (+ positions), before the first block
    ATTN_IN = "attn_in"
    ATTN_OUT = "attn_out"
    ATTN_AFTER_ADD = "attn_after_add"
    MLP_IN = "mlp_in"
    MLP_HIDDEN = "mlp_hidden"  # on the up-projection's output, before the activation
    MLP_OUT = "mlp_out"
    MLP_AFTER_ADD = "mlp_after_add"
    FINAL = "final"  # before the head
    LOGITS = "logits"  # on the head's output (width = vocab or classes)

    BLOCK = (ATTN_IN, ATTN_OUT, ATTN_AFTER_ADD, MLP_IN, MLP_HIDDEN, MLP_OUT, MLP_AFTER_ADD)
    MODEL = (EMBEDDING, FINAL, LOGITS)


class Role:
    """What a parameter does. Projections get theirs from the block (``ProjectionType.linear(..., role)``) and
    declare it (``arch_plugins.declarations.declare_role``); norms, residuals and task models declare their own.
    A plugin may use a role of its own (any other string, declared with its ``Kind``)."""

    Q, K, V = "q", "k", "v"
    ATTN_OUT = "attn_out"
    MLP_IN = "mlp_in"  # for gated MLPs: the value half of the up-projection
    MLP_GATE = "mlp_gate"
    MLP_OUT = "mlp_out"
    FFN = "ffn"  # a whole feed-forward made by the projection type (TokenFormer)
    EMBEDDING = "embedding"  # token or patch embedding
    POSITION = "position"  # learned position embedding
    CLS_TOKEN = "cls_token"  # a learned token prepended to the sequence (ViT)
    HEAD = "head"  # unembedding / classifier
    GAIN = "gain"  # a norm's elementwise gain (width-sized)
    BIAS = "bias"  # any additive bias vector
    SCALAR = "scalar"  # a single learned number (or a few, independent of width)

    # Roles whose output is added to the residual stream: depth-scaled init applies to them.
    WRITES_TO_STREAM = (ATTN_OUT, MLP_OUT, FFN)


class Kind:
    """What optimizers and parametrizations route on: every role has exactly one kind.

    ``hidden``: a matrix both of whose dims grow with width (Muon's domain; muP's matrix-like rules).
    ``embedding``: maps a finite input (vocabulary, patches, positions) into the width. ``head``: maps the width
    to a finite output (logits). ``readout``: inside the model, a weight whose fan-in grows with width and whose
    fan-out does not (a gate or mixing coefficient read off the stream: muP's output-layer rules, lr and init
    over the fan-in ratio). ``vector``: one dim grows with width and it is the fan-out (gains, biases).
    ``scalar``: none does.
    """

    HIDDEN = "hidden"
    EMBEDDING = "embedding"
    HEAD = "head"
    READOUT = "readout"
    VECTOR = "vector"
    SCALAR = "scalar"
    ALL = (HIDDEN, EMBEDDING, HEAD, READOUT, VECTOR, SCALAR)


class NormStrategy:
    """Decides how activation scale is kept in check, at every site, and which weights are constrained.

    Subclasses take their options as keyword arguments of ``__init__`` (they are settable from YAML
    and the command line as ``norm_options``).
    """

    def site(self, site: str, dim: int, layer: int | None, stack: StackInfo) -> nn.Module | None:
        """The module applied at ``site`` (a tensor whose last dim is ``dim``), or None for identity.

        ``layer`` is the 0-based block index for block sites, None for model-level sites.
        """
        return None

    def qk_before_rope(self, layer: int, stack: StackInfo) -> nn.Module | None:
        """A module ``(q, k) -> (q, k)`` applied per head before RoPE, shapes (B, H, T, head_dim).

        Where QK-norm with learned gains sits in Qwen3, Gemma 3 and OLMo 2 (a per-channel gain does not commute
        with the rotation, so the place matters once the gains move).
        """
        return None

    def qk(self, layer: int, stack: StackInfo) -> nn.Module | None:
        """A module ``(q, k) -> (q, k)`` applied per head after RoPE, shapes (B, H, T, head_dim)."""
        return None

    def softmax_scale(self, layer: int, stack: StackInfo) -> float | None:
        """The attention logit scale; None means the standard 1/sqrt(head_dim)."""
        return None

    def attention_probs(self, layer: int, stack: StackInfo) -> nn.Module | None:
        """A module turning attention logits into weights, replacing the softmax; None keeps the softmax.

        It receives the scaled logits (B, H, T, S) with disallowed positions (causal mask) at -inf and returns
        weights of the same shape (clipped softmax). With a module here the block computes attention explicitly
        instead of through the fused kernel, so None is what keeps the fast path.
        """
        return None

    def attention_gate(self, layer: int, stack: StackInfo) -> nn.Module | None:
        """A module ``(x, y) -> y`` on each head's attention output before the output projection, or None.

        ``x`` is the attention sublayer's input (B, T, d_model, after the ``attn_in`` site), ``y`` the heads'
        outputs (B, H, T, head_dim): where a per-head gate computed from the input multiplies the output.
        """
        return None

    def constrains(self, role: str) -> bool:
        """Whether weights of ``role`` must be kept at unit norm along their d_model axis."""
        return False

    def bind(self, layer: int, block: nn.Module, stack: StackInfo) -> None:
        """Called once per block, after the block is built, with the block itself.

        For strategies whose site modules read the weights of the block they sit in: BHyT approximates
        the MLP-input variance from W_V and W_O, found by role (``arch_plugins.declarations.dense_role``), never
        by attribute name. Most strategies do nothing here.
        """

    def incremental_decoding_conflict(self, stack: StackInfo) -> str | None:
        """What of this strategy stops a causal stack from decoding with a KV cache, in a few words that end with the
        option that removes it, or None (default): every site module computes position t from position t.

        A KV-cached decoding step (``GPT.generate``) runs the new positions alone, with the keys and values of the
        earlier ones kept; that computes what the whole sequence does only where every module but attention computes
        position t from position t (in eval mode). A site that reads the position within the sequence it is
        handed (3PT's horn) or statistics over positions says so here; ``generate`` then recomputes the whole
        context at every step and warns with this reason. tests/test_kv_cache.py checks every registered name
        against the uncached output.
        """
        return None


class ResidualMerge(nn.Module):
    """Merges one sublayer's output into the residual stream. One instance per sublayer."""

    def branch_input(self, h: torch.Tensor, history: ResidualHistory) -> torch.Tensor:
        """What the sublayer reads (before its ``*_in`` norm site). Plain residuals read the stream."""
        return h

    def forward(self, h: torch.Tensor, branch: torch.Tensor, history: ResidualHistory) -> torch.Tensor:
        raise NotImplementedError

    def fuse(self, branch_site: nn.Module, after_add_site: nn.Module) -> bool:
        """Offer to run the sublayer's tail as one step; True takes it, and the block then calls ``fused``.

        The tail is ``y = branch_site(raw); h = after_add_site(self(h, y, history))`` (the ``*_out`` site, this
        merge, the ``*_after_add`` site). A merge that knows both sites can compute it in one pass (nGPT's
        normalise-interpolate-normalise as one kernel). Asked once, when the block is built, and only where
        nothing stands between the sites and the merge (no stochastic depth). Default: decline.
        A merge that accepts must not register the sites as its submodules (the block owns them).
        """
        return False

    def fused(self, h: torch.Tensor, raw: torch.Tensor, history: ResidualHistory) -> tuple[torch.Tensor, torch.Tensor]:
        """The fused tail: (the new stream, ``branch_site(raw)``), the second for ``history.branches``."""
        raise NotImplementedError


class ResidualStream(nn.Module):
    """Stream-level state of a residual type: e.g. expanding into several streams and reducing back.

    ``begin`` turns the embedding (B, T, d) into the stream the blocks carry, which may be wider (hyper-connections
    carry (B, T, n, d): every block site and merge then sees that shape, and ``branch_input`` must hand the
    sublayer a (B, T, d) tensor); ``end`` turns the last block's stream back into (B, T, d) before the final site
    (a sum of the streams, or Attention Residuals' final aggregation over depth). Both default to identity.
    """

    def begin(self, x: torch.Tensor, history: ResidualHistory) -> torch.Tensor:
        return x

    def end(self, h: torch.Tensor, history: ResidualHistory) -> torch.Tensor:
        return h


class _NotRecorded:
    """What a history that is not recorded holds instead of its lists: any read says how to get a recorded one
    (a residual reading entries that were never kept would otherwise fail far from the cause, or read nothing)."""

    def __init__(self, field: str):
        self.field = field

    def _refuse(self, *args, **kwargs):
        raise PluginError(f"the residual history's {self.field} were not kept in this forward pass: the stack keeps "
                          f"them only when the residual type's reads_history(stack) returns True (or a probe asks "
                          f"for them); a residual whose merge or stream reads the history must say so there")

    __getitem__ = __len__ = __iter__ = __bool__ = append = _refuse


class ResidualHistory:
    """Everything earlier layers produced in this forward pass, for residuals that look back.

    ``states[0]`` is the stream entering the first block; after that one entry per sublayer, in
    order (attn of block 0, mlp of block 0, attn of block 1, ...). ``branches`` holds each
    sublayer's output after its ``*_out`` site, aligned with ``states[1:]``; ``block_inputs`` holds
    the stream entering each block.

    Recorded (``recording``) only when something reads it: the residual type says so
    (``ResidualType.reads_history``), or a diagnostics probe asks the stack. Otherwise the lists are not
    kept, because keeping them is not free: each entry holds a (B, T, d) tensor alive until the forward
    pass ends that autograd would have freed or never saved (a branch is not saved by the add that consumes
    it), so a recorded history raises peak activation memory, and under activation checkpointing it keeps
    every sublayer's output alive instead of each block's input alone. A history that is not recorded
    refuses to be read (``PluginError``), so an undeclared reader fails at once.

    One object shared by every block of a forward pass, which each block appends to. Deliberately a plain
    class, not a dataclass or a container: wrappers that rebuild a module's arguments (FSDP2 casting
    inputs to bf16 under a mixed-precision policy, through ``torch.distributed.utils._apply_to_tensors``)
    copy dataclasses, lists and tuples, and every block would then append to a copy of its own.
    """

    def __init__(self, states: list[torch.Tensor] | None = None, branches: list[torch.Tensor] | None = None,
                 block_inputs: list[torch.Tensor] | None = None, *, recording: bool = True):
        self.recording = recording
        if recording:
            self.states = states if states is not None else []
            self.branches = branches if branches is not None else []
            self.block_inputs = block_inputs if block_inputs is not None else []
        else:
            self.states, self.branches, self.block_inputs = (
                _NotRecorded(field) for field in ("states", "branches", "block_inputs"))


class ResidualType:
    """Decides how each sublayer's output merges into the stream."""

    def merge(self, sublayer: Literal["attn", "mlp"], layer: int, stack: StackInfo) -> ResidualMerge:
        raise NotImplementedError

    def stream(self, stack: StackInfo) -> ResidualStream | None:
        """Stream-level state, or None when the stream is a single tensor passed through."""
        return None

    def reads_history(self, stack: StackInfo) -> bool:
        """Whether this residual's merges or stream read the ``ResidualHistory`` (earlier states, branches or
        block inputs). False (default): the stack does not record the history, which frees memory (see
        ``ResidualHistory``); the history the merges are handed then refuses to be read."""
        return False

    def depth_scaling_conflict(self, stack: StackInfo) -> str | None:
        """What of this residual a branch multiplier does not depth-scale, for a depth parametrization (CompleteP:
        each sublayer's output times L^-alpha) to refuse in one line: a term the merge adds to the stream outside
        the branch, in a few words that end with the option that removes it. None (default): every per-layer
        change to the stream passes through the branch."""
        return None

    def incremental_decoding_conflict(self, stack: StackInfo) -> str | None:
        """What of this residual stops a causal stack from decoding with a KV cache (a few words ending with the option
        that removes it), or None (default): the merges and the stream compute position t from position t of the
        stream and of the history (earlier layers at the same position, as LAUREL-PA and AttnRes read it).

        A KV-cached decoding step (``GPT.generate``) runs the new positions alone, with the keys and values of the
        earlier ones kept; that computes what the whole sequence does only where every module but attention computes
        position t from position t (in eval mode). ``generate`` recomputes the whole context at every step,
        warning with this reason.
        """
        return None


class ProjectionType:
    """Decides what maps d_in to d_out inside the block, and optionally what the FFN is made of.

    A projection module must accept (..., d_in) and return (..., d_out). To carry nGPT-style unit-norm
    constraints it implements ``constrain_unit_norm(axis)`` with axis "in" or "out" (which side is
    d_model), declaring its parameters through ``arch_plugins.declarations.declare_unit_norm``. It declares its
    parameters' roles (``declare_role``) from the ``role`` it is given.
    """

    def linear(self, d_in: int, d_out: int, role: str, layer: int, stack: StackInfo, *, bias: bool,
               init_std: float) -> nn.Module:
        raise NotImplementedError

    def fused(self, d_in: int, d_outs: list[int], roles: list[str], layer: int, stack: StackInfo, *,
              bias: bool, init_std: float) -> nn.Module:
        """Several projections of one input, outputs concatenated on the last dim (q|k|v, value|gate).

        The default builds them separately; a projection type may fuse them into one matmul.
        """
        return Concat([self.linear(d_in, d, r, layer, stack, bias=bias, init_std=init_std)
                       for d, r in zip(d_outs, roles, strict=True)])

    def ffn(self, layer: int, stack: StackInfo, *, bias: bool, init_std: float) -> nn.Module | None:
        """A whole feed-forward sublayer (d_model -> d_model), or None for the stack's standard MLP."""
        return None

    def depth_scaling_conflict(self, stack: StackInfo) -> str | None:
        """A depth rule of this projection's own that a branch multiplier would apply a second time (an init
        with a 1/n_layers factor), for a depth parametrization (CompleteP) to refuse in one line: a few words
        that end with the option that removes it. None (default): the projection's init does not follow depth."""
        return None

    def incremental_decoding_conflict(self, stack: StackInfo) -> str | None:
        """What of this projection stops a causal stack from decoding with a KV cache (a few words ending with the
        option that removes it), or None (default): each token is projected on its own (Pattention attends over
        parameter tokens, not over positions).

        A KV-cached decoding step (``GPT.generate``) runs the new positions alone, with the keys and values of the
        earlier ones kept; that computes what the whole sequence does only where every module but attention computes
        position t from position t (in eval mode). ``generate`` recomputes the whole context at every step,
        warning with this reason.
        """
        return None


class Concat(nn.Module):
    """Applies several modules to one input and concatenates their outputs."""

    def __init__(self, parts: list[nn.Module]):
        super().__init__()
        self.parts = nn.ModuleList(parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([p(x) for p in self.parts], dim=-1)


class Parametrization:
    """Decides how init, per-role optimizer multipliers and the stack's multipliers change with width and depth,
    so that hyperparameters tuned at a base shape transfer (muP, CompleteP). The defaults are standard
    parametrization: every hook answers "as the config says".

    The stack asks it once, at build time: ``init_multiplier`` for every matrix the block builds (by role and
    kind), ``attention_multiplier`` for the attention logit scale, ``branch_multiplier`` for each sublayer's
    output before it merges into the stream, ``output_multiplier`` for the head's input. After the whole model
    is built, ``optimizer_scale`` is asked once per trainable parameter (``ParameterRole``: role and kind, never
    a name) and the answer is declared on the parameter (``declare_optimizer_scale``) for whichever optimizer
    is built. ``check`` refuses, in one line, a combination with no defined rule.
    """

    # GPT-2's 1/sqrt(2 n_layers) on the matrices that write to the stream (TransformerConfig.depth_scaled_init);
    # a depth parametrization that scales the branches itself turns it off.
    keeps_depth_scaled_init = True
    # Whether every trainable parameter must have a declared role (a parametrization with per-role rules).
    needs_roles = False

    def check(self, stack: StackInfo, *, norm: NormStrategy, residual: ResidualType,
              projection: ProjectionType) -> None:
        """Raise ``ValueError`` (one line, what to do) for a combination this parametrization has no rule for."""

    def base_shape(self, stack: StackInfo) -> tuple[int, int] | None:
        """(d_model, n_heads) of the model at the base shape, the width its hyperparameters were tuned at, or None
        (no base: every parameter is its own base). The stack builds itself at that width (on the meta device,
        its own ``mlp_hidden`` rule included) and gives every parameter its own fan-in and fan-out ratios against
        its base twin (``ParameterRole.fan_in_ratio``/``fan_out_ratio``), as microsoft/mup's base shapes do."""
        return None

    def init_multiplier(self, role: str, kind: str, stack: StackInfo) -> float:
        """Multiplies the init std of a matrix the block builds (``kind`` is the role's ``Kind``). A rule that
        depends on the matrix's own shape belongs in ``reinitialize``, which sees its fan-in ratio."""
        return 1.0

    def attention_multiplier(self, stack: StackInfo) -> float:
        """Multiplies the attention logit scale (the norm strategy's, else 1/sqrt(head_dim))."""
        return 1.0

    def branch_multiplier(self, stack: StackInfo) -> float:
        """Multiplies each sublayer's output (after its ``*_out`` site) before the residual merge."""
        return 1.0

    def output_multiplier(self, stack: StackInfo) -> float:
        """Multiplies the head's input (the readout), i.e. the logits of a bias-free head."""
        return 1.0

    def check_roles(self, roles: set[str], stack: StackInfo) -> None:
        """Refuse (``ValueError``, one line) a task model whose parameters' roles leave an option nothing to act on
        (muP's ``readout_zero_init`` with a tied head: no parameter has the head role). Called once with every
        role the whole task model declares, before any ``reinitialize``. Default: accept."""

    def reinitialize(self, parameter, stack: StackInfo) -> None:
        """Change the init of one ``ParameterRole`` after the whole model is built (called under ``no_grad``):
        e.g. a zero-initialised query (the rows of a fused q|k|v matrix that ``parameter.slices`` names q), or
        muP's init over the parameter's own fan-in ratio (``parameter.fan_in_ratio``; ``parameter.init``
        says whether its std was width-independent or already over sqrt(fan-in)). Default: keep it."""

    def optimizer_scale(self, parameter, stack: StackInfo, *, in_blocks: bool):
        """The ``OptimizerScale`` (lr, weight decay, epsilon multipliers) of one ``ParameterRole``; ``in_blocks``:
        whether the parameter lives inside the blocks (residual-branch parameters) rather than in the
        embedding, the final site or the head. Default: all 1 (nothing declared)."""
        return None

    def muon_scale(self, parameter, stack: StackInfo, *, in_blocks: bool):
        """The ``OptimizerScale`` (lr and weight-decay multipliers of Muon's own) of a hidden matrix when Muon steps
        it instead of Adam, with Muon's step scaled by the spectral rule sqrt(fan_out / fan_in) of each matrix;
        asked only where ``optimizer_scale`` declared a rule. Default None: no rule stated for Muon, which then
        refuses the parameter (an Adam-derived scale on an orthogonalised step double-scales it)."""
        return None


class OptimizerType:
    """Builds the torch optimizer of a model from its parameters' declared roles (``--model.optimizer``).

    Options (``--model.optimizer_options``) are the constructor's keyword arguments. ``build`` receives the
    task's peak ``lr``, ``weight_decay`` and AdamW ``betas``. Each parameter's declared ``OptimizerScale``
    (``arch_plugins.declarations.optimizer_scales``: a parametrization's lr, weight-decay and Adam-epsilon
    multipliers) multiplies its settings (``routing.settings`` reads them); an optimizer that steps a parameter
    by another rule than Adam's refuses a declared scale. It returns one
    ``torch.optim.Optimizer`` whose param groups each carry ``lr_ratio``: the group's learning rate over the task's
    ``lr``, so the learning-rate schedule and the logged ``train/lr`` stay the task's. Groups are routed by role,
    never by parameter name or shape (``arch_plugins/optimizers``).
    """

    def build(self, model: nn.Module, *, lr: float, weight_decay: float,
              betas: tuple[float, float]) -> torch.optim.Optimizer:
        raise NotImplementedError


# The interface each entry-point group's plugins must implement.
KIND_INTERFACES: dict[str, type] = {
    "norm": NormStrategy,
    "residual": ResidualType,
    "projection": ProjectionType,
    "parametrization": Parametrization,
    "optimizer": OptimizerType,
}
