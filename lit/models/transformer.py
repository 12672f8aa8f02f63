"""One transformer stack for every task: attention and MLP sublayers wired through the plugin kinds.

The block names no plugin. It asks the norm strategy for a module at every site, the residual type
for a merge per sublayer, the projection type for every matrix, and the parametrization for its
multipliers (init, attention scale, residual branch, readout) and each parameter's optimizer scale, and
calls all of them unconditionally (a site a strategy does not use is an ``nn.Identity``). Adding a
component never edits this file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F
from timm.layers import DropPath
from torch import nn

from arch_plugins import registry
from arch_plugins.constraints import declare_unit_norm
from arch_plugins.declarations import (
    ROLE_KINDS,
    MuonRule,
    ParameterRole,
    declare_adam_rule,
    declare_muon_rule,
    declare_optimizer_scale,
    parameter_roles,
    width_ratios,
)
from arch_plugins.interfaces import Concat, Kind, ResidualHistory, Role, Site, StackInfo
from arch_plugins.stabilisers import with_stabilisers
from lit.errors import ArchitectureError
from lit.models.kv_cache import KVCache
from lit.models.rope import RotaryEmbedding


@dataclass
class TransformerConfig:
    """Architecture of the stack. Components are names resolved through the plugin registry.

    Args:
        norm: norm strategy, one of the installed {norm}; `python cli.py plugins NAME` shows its options.
        norm_options: options of the norm strategy, e.g. {{eps: 1e-6}}.
        residual: residual type, one of the installed {residual}.
        residual_options: options of the residual type.
        projection: projection type, one of the installed {projection}.
        projection_options: options of the projection type.
        parametrization: how init, learning rates and multipliers follow width and depth, one of the installed
            {parametrization} (sp: standard, the default).
        parametrization_options: its base shape and options, e.g. {{base_width: 64, base_heads: 4}}.
    """

    d_model: int = 256
    n_layers: int = 6
    n_heads: int = 4
    # relu2: ReLU(x)^2 (Primer; modded-nanogpt's MLP). gelu_tanh: GELU's tanh approximation (GPT-2's gelu_new).
    mlp: Literal["swiglu", "gelu", "gelu_tanh", "relu2"] = "swiglu"
    # Hidden width of the MLP; None: 4*d for GELU and ReLU^2, 2/3 of that (rounded up to 64) for SwiGLU,
    # so both have the same parameter count.
    mlp_hidden: int | None = None
    bias: bool = False
    dropout: float = 0.0
    # Stochastic depth (DeiT): each sublayer's branch is dropped per sample with a rate growing
    # linearly over the blocks from 0 to this value.
    drop_path: float = 0.0
    positions: Literal["rope", "learned", "none"] = "rope"
    rope_base: float = 10000.0
    # Fraction of each head's dims that RoPE rotates (GPT-NeoX's rotary_pct; TokenFormer uses 0.25); 1: all of them.
    rope_pct: float = 1.0
    init_std: float = 0.02
    # GPT-2's scaling of the projections that write to the stream by 1/sqrt(2 * n_layers).
    depth_scaled_init: bool = True
    norm: str = "rmsnorm"
    norm_options: dict[str, Any] = field(default_factory=dict)
    residual: str = "add"
    residual_options: dict[str, Any] = field(default_factory=dict)
    projection: str = "linear"
    projection_options: dict[str, Any] = field(default_factory=dict)
    parametrization: str = "sp"
    parametrization_options: dict[str, Any] = field(default_factory=dict)
    # Stabilisers on top of whichever norm strategy (arch_plugins/stabilisers): QK-norm per head before RoPE
    # (Qwen3, Gemma 3), and cap * tanh(logits / cap) on the head's output (Gemma 2 uses 30). None: off.
    qk_norm: Literal["rmsnorm", "layernorm"] | None = None
    qk_norm_eps: float = 1e-6
    logit_softcap: float | None = None
    # Quantizable Transformers' attention stabilisers. Clipped softmax: clip((zeta - gamma) softmax + gamma, 0, 1),
    # gamma <= 0 (the paper: -alpha / T), zeta >= 1; None: the plain softmax through SDPA. Gated attention: a
    # per-head sigmoid gate from each head's slice of the input, opening to gated_attention_init at init
    # (0.25 in the paper's OPT runs; None: nn.Linear's default bias).
    clipped_softmax_gamma: float | None = None
    clipped_softmax_zeta: float = 1.0
    gated_attention: bool = False
    gated_attention_init: float | None = 0.25

    def resolved_mlp_hidden(self) -> int:
        if self.mlp_hidden is not None:
            return self.mlp_hidden
        if self.mlp in ("gelu", "gelu_tanh", "relu2"):
            return 4 * self.d_model
        return 64 * math.ceil(4 * self.d_model * 2 / 3 / 64)



# `--help` lists the names installed now (package metadata only, nothing imported); the registry still
# decides at build time, so a plugin registered in-process later is accepted too.
TransformerConfig.__doc__ = TransformerConfig.__doc__.format(
    **{kind: f"{kind}s ({', '.join(registry.names(kind))})" for kind in registry.kinds()})


def divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def _site(norm, site: str, dim: int, layer: int | None, stack: StackInfo) -> nn.Module:
    return norm.site(site, dim, layer, stack) or nn.Identity()


def _init_std(cfg: TransformerConfig, role: str, plugins: Plugins, stack: StackInfo) -> float:
    parametrization = plugins.parametrization
    std = cfg.init_std
    if cfg.depth_scaled_init and role in Role.WRITES_TO_STREAM and parametrization.keeps_depth_scaled_init:
        std = std / math.sqrt(2 * cfg.n_layers)
    multiplier = parametrization.init_multiplier(role, ROLE_KINDS[role], stack)
    return std if multiplier == 1.0 else std * multiplier


class Plugins:
    """The components of one stack, instantiated from their names and options."""

    def __init__(self, cfg: TransformerConfig):
        self.norm = with_stabilisers(registry.create("norm", cfg.norm, cfg.norm_options), cfg.norm,
                                     qk_norm=cfg.qk_norm, qk_norm_eps=cfg.qk_norm_eps, logit_softcap=cfg.logit_softcap,
                                     clipped_softmax_gamma=cfg.clipped_softmax_gamma,
                                     clipped_softmax_zeta=cfg.clipped_softmax_zeta,
                                     gated_attention=cfg.gated_attention,
                                     gated_attention_init=cfg.gated_attention_init)
        self.residual = registry.create("residual", cfg.residual, cfg.residual_options)
        self.projection = registry.create("projection", cfg.projection, cfg.projection_options)
        self.parametrization = registry.create("parametrization", cfg.parametrization, cfg.parametrization_options)
        # Where each component came from (package, version), for the run's provenance.
        self.specs = [registry.spec(kind, name) for kind, name in
                      (("norm", cfg.norm), ("residual", cfg.residual), ("projection", cfg.projection),
                       ("parametrization", cfg.parametrization))]


def _constrain(plugins: Plugins, module: nn.Module, role: str, axis: Literal["in", "out"]) -> None:
    """Ask the module to declare unit-norm weights if the norm strategy constrains this role."""
    if not plugins.norm.constrains(role):
        return
    parts = list(module.parts) if isinstance(module, Concat) else [module]
    if not all(hasattr(part, "constrain_unit_norm") for part in parts):
        raise registry.PluginError(
            f"norm {type(plugins.norm).__name__} constrains {role} weights to the unit sphere, but the "
            f"projection {type(plugins.projection).__name__} cannot declare constraints "
            f"(it lacks constrain_unit_norm); pick another projection or norm")
    for part in parts:
        part.constrain_unit_norm(axis)


class Attention(nn.Module):
    def __init__(self, cfg: TransformerConfig, stack: StackInfo, layer: int, plugins: Plugins):
        super().__init__()
        d, proj = cfg.d_model, plugins.projection
        self.n_heads, self.causal, self.dropout = cfg.n_heads, stack.causal, cfg.dropout
        self.layer = layer  # which of a KV cache's layers is this one's
        roles = [Role.Q, Role.K, Role.V]
        self.qkv = proj.fused(d, [d, d, d], roles, layer, stack, bias=cfg.bias,
                              init_std=_init_std(cfg, Role.Q, plugins, stack))
        self.out = proj.linear(d, d, Role.ATTN_OUT, layer, stack, bias=cfg.bias,
                               init_std=_init_std(cfg, Role.ATTN_OUT, plugins, stack))
        _constrain(plugins, self.qkv, Role.Q, "in")
        _constrain(plugins, self.out, Role.ATTN_OUT, "out")
        self.qk_before_rope = plugins.norm.qk_before_rope(layer, stack)  # None: nothing before RoPE
        self.qk = plugins.norm.qk(layer, stack)  # None: no q/k normalisation after RoPE
        self.scale = plugins.norm.softmax_scale(layer, stack)
        multiplier = plugins.parametrization.attention_multiplier(stack)
        if multiplier != 1.0:
            self.scale = (self.scale if self.scale is not None else stack.head_dim ** -0.5) * multiplier
        self.probs = plugins.norm.attention_probs(layer, stack)  # None: the softmax, through SDPA
        self.gate = plugins.norm.attention_gate(layer, stack)  # None: no gate on the heads' outputs
        # Set only while a diagnostics probe runs (lit/diagnostics/probe.py): called with the q and k the
        # attention really uses (plugins applied), its scale and causality, since SDPA hides probabilities.
        self.inspect: Callable[[torch.Tensor, torch.Tensor, float, bool], None] | None = None

    def forward(self, x: torch.Tensor, rope: RotaryEmbedding | None, cache: KVCache | None = None) -> torch.Tensor:
        """x: (B, T, d). With a ``cache``, x holds the T positions after the ``cache.length`` cached ones, whose
        keys and values the cache adds to the attention (lit/models/kv_cache.py)."""
        B, T, d = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        if self.qk_before_rope is not None:
            q, k = self.qk_before_rope(q, k)
        offset = cache.positions(T, x.device) if cache is not None else 0
        if rope is not None:
            q, k = rope(q, offset), rope(k, offset)
        if self.qk is not None:
            q, k = self.qk(q, k)
        causal, mask = self.causal, None
        if cache is not None:
            k, v = cache.extend(self.layer, k, v)
            causal, mask = cache.attention_mask(T, k.shape[-2], x.device)
        if self.inspect is not None:
            self.inspect(q, k, self.scale if self.scale is not None else q.shape[-1] ** -0.5, self.causal)
        if self.probs is None:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=self.scale,
                                               dropout_p=self.dropout if self.training else 0.0)
        else:
            y = self._explicit_attention(q, k, v, mask)
        if self.gate is not None:
            y = self.gate(x, y)
        return self.out(y.transpose(1, 2).reshape(B, T, d))

    def _explicit_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            mask: torch.Tensor | None = None) -> torch.Tensor:
        """Attention with the weights made by ``self.probs`` instead of the softmax (which SDPA fuses away);
        ``mask`` (True: seen) replaces the causal triangle where a KV cache gives one."""
        scale = self.scale if self.scale is not None else q.shape[-1] ** -0.5
        # In the compute dtype (bf16 under autocast), not fp32: the (B, H, T, S) scores, weights and what backward
        # keeps of them are half the bytes, and the product q kᵀ is already rounded to that dtype. ``probs``
        # normalises with fp32 accumulation inside its kernel (ClippedSoftmax).
        scores = (q @ k.transpose(-1, -2)) * scale
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        elif self.causal:
            T, S = scores.shape[-2:]
            future = torch.ones(T, S, dtype=torch.bool, device=scores.device).triu(S - T + 1)
            scores = scores.masked_fill(future, float("-inf"))
        weights = self.probs(scores).to(v.dtype)
        if self.training and self.dropout > 0:
            weights = F.dropout(weights, p=self.dropout)
        return weights @ v


class MLP(nn.Module):
    """GELU or ReLU^2 MLP, or SwiGLU (value * silu(gate)), with a norm-strategy site on the hidden pre-activation."""

    def __init__(self, cfg: TransformerConfig, stack: StackInfo, layer: int, plugins: Plugins):
        super().__init__()
        d, hidden, proj = cfg.d_model, stack.mlp_hidden, plugins.projection
        self.gated, self.relu2 = cfg.mlp == "swiglu", cfg.mlp == "relu2"
        self.gelu_approximation = "tanh" if cfg.mlp == "gelu_tanh" else "none"
        widths, roles = ([hidden, hidden], [Role.MLP_IN, Role.MLP_GATE]) if self.gated else ([hidden], [Role.MLP_IN])
        self.up = proj.fused(d, widths, roles, layer, stack, bias=cfg.bias,
                             init_std=_init_std(cfg, Role.MLP_IN, plugins, stack))
        self.hidden = _site(plugins.norm, Site.MLP_HIDDEN, sum(widths), layer, stack)
        self.down = proj.linear(hidden, d, Role.MLP_OUT, layer, stack, bias=cfg.bias,
                                init_std=_init_std(cfg, Role.MLP_OUT, plugins, stack))
        _constrain(plugins, self.up, Role.MLP_IN, "in")
        _constrain(plugins, self.down, Role.MLP_OUT, "out")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u = self.hidden(self.up(x))
        if self.gated:
            value, gate = u.chunk(2, dim=-1)
            return self.down(value * F.silu(gate))
        if self.relu2:
            return self.down(F.relu(u).square())
        return self.down(F.gelu(u, approximate=self.gelu_approximation))


class Block(nn.Module):
    def __init__(self, cfg: TransformerConfig, stack: StackInfo, layer: int, plugins: Plugins):
        super().__init__()
        norm, d = plugins.norm, cfg.d_model
        self.attn_in = _site(norm, Site.ATTN_IN, d, layer, stack)
        self.attn = Attention(cfg, stack, layer, plugins)
        self.attn_out = _site(norm, Site.ATTN_OUT, d, layer, stack)
        self.attn_merge = plugins.residual.merge("attn", layer, stack)
        self.attn_after_add = _site(norm, Site.ATTN_AFTER_ADD, d, layer, stack)

        self.mlp_in = _site(norm, Site.MLP_IN, d, layer, stack)
        ffn = plugins.projection.ffn(layer, stack, bias=cfg.bias, init_std=_init_std(cfg, Role.FFN, plugins, stack))
        self.mlp = ffn if ffn is not None else MLP(cfg, stack, layer, plugins)
        if ffn is not None:
            _constrain(plugins, ffn, Role.FFN, "in")
        self.mlp_out = _site(norm, Site.MLP_OUT, d, layer, stack)
        self.mlp_merge = plugins.residual.merge("mlp", layer, stack)
        self.mlp_after_add = _site(norm, Site.MLP_AFTER_ADD, d, layer, stack)
        # No module at all when off: dropout(p=0) still launches a kernel on GPU.
        self.drop = nn.Dropout(cfg.dropout) if cfg.dropout > 0 else nn.Identity()
        rate = cfg.drop_path * layer / max(1, cfg.n_layers - 1)
        self.drop_path = DropPath(rate) if rate > 0 else nn.Identity()
        norm.bind(layer, self, stack)  # sites that read this block's weights (BHyT) find them now
        # The parametrization's residual-branch multiplier (CompleteP's depth rule), on the branch as the merge
        # receives it. None: none (not even a multiplication by 1, which would cost a kernel).
        branch = plugins.parametrization.branch_multiplier(stack)
        self.branch_multiplier = None if branch == 1.0 else branch
        # A merge may take over its sublayer's tail (out site, merge, after-add site) and run it fused; not
        # when stochastic depth or a branch multiplier stands between the out site and the merge.
        fusable = isinstance(self.drop_path, nn.Identity) and self.branch_multiplier is None
        self.attn_fused = fusable and self.attn_merge.fuse(self.attn_out, self.attn_after_add)
        self.mlp_fused = fusable and self.mlp_merge.fuse(self.mlp_out, self.mlp_after_add)

    def forward(self, h: torch.Tensor, history: ResidualHistory, rope: RotaryEmbedding | None,
                cache: KVCache | None = None) -> torch.Tensor:
        recording = history.recording
        if recording:
            history.block_inputs.append(h)
        x = self.attn_merge.branch_input(h, history)
        y = self.drop(self.attn(self.attn_in(x), rope, cache))
        if self.attn_fused:
            h, y = self.attn_merge.fused(h, y, history)
        else:
            y = self.drop_path(self.attn_out(y))
            if self.branch_multiplier is not None:
                y = y * self.branch_multiplier
            h = self.attn_after_add(self.attn_merge(h, y, history))
        if recording:
            history.states.append(h)
            history.branches.append(y)

        x = self.mlp_merge.branch_input(h, history)
        y = self.drop(self.mlp(self.mlp_in(x)))
        if self.mlp_fused:
            h, y = self.mlp_merge.fused(h, y, history)
        else:
            y = self.drop_path(self.mlp_out(y))
            if self.branch_multiplier is not None:
                y = y * self.branch_multiplier
            h = self.mlp_after_add(self.mlp_merge(h, y, history))
        if recording:
            history.states.append(h)
            history.branches.append(y)
        return h


class TransformerStack(nn.Module):
    """Embedding site -> blocks -> final site. Inputs are already embedded (B, T, d_model)."""

    def __init__(self, cfg: TransformerConfig, *, causal: bool, max_len: int):
        super().__init__()
        if cfg.d_model % cfg.n_heads:
            raise ArchitectureError(f"d_model={cfg.d_model} is not divisible by n_heads={cfg.n_heads}: attention "
                                    f"splits the width into equal heads; choose n_heads among "
                                    f"{', '.join(str(h) for h in divisors(cfg.d_model) if h <= 64)} or change d_model")
        if cfg.n_layers < 1 or cfg.d_model < 1:
            raise ArchitectureError(f"n_layers={cfg.n_layers} and d_model={cfg.d_model} must be positive")
        self.cfg, self.max_len = cfg, max_len
        self.info = StackInfo(cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.resolved_mlp_hidden(), causal)
        self.plugins = Plugins(cfg)
        norm = self.plugins.norm
        try:
            self.plugins.parametrization.check(self.info, norm=norm, residual=self.plugins.residual,
                                               projection=self.plugins.projection)
        except ValueError as exc:
            raise ArchitectureError(f"parametrization {cfg.parametrization!r} with norm {cfg.norm!r}, residual "
                                    f"{cfg.residual!r}, projection {cfg.projection!r}: {exc}") from exc
        self.rope = (RotaryEmbedding(self.info.head_dim, max_len, cfg.rope_base, cfg.rope_pct)
                     if cfg.positions == "rope" else None)
        self.embedding = _site(norm, Site.EMBEDDING, cfg.d_model, None, self.info)
        self.stream = self.plugins.residual.stream(self.info)
        self.blocks = nn.ModuleList(Block(cfg, self.info, i, self.plugins) for i in range(cfg.n_layers))
        self.final = _site(norm, Site.FINAL, cfg.d_model, None, self.info)
        # The residual history is recorded only where it is read (see ResidualHistory): by the residual type,
        # or, while it runs, by a diagnostics probe (``recording_history``).
        self.residual_reads_history = self.plugins.residual.reads_history(self.info)
        self.history_wanted = False

    @contextlib.contextmanager
    def recording_history(self):
        """Record the residual history in the forward passes run inside (for a probe that reads it)."""
        wanted, self.history_wanted = self.history_wanted, True
        try:
            yield
        finally:
            self.history_wanted = wanted

    def forward(self, x: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """x: (B, T, d) -> (B, T, d). With a ``cache``: the T positions after the cached ones, which the cache then
        counts (only where ``incremental_decoding_conflict`` is None does that equal running the whole sequence)."""
        x = self.embedding(x)
        if self.residual_reads_history or self.history_wanted:
            history = ResidualHistory(states=[x])
        else:
            history = ResidualHistory(recording=False)
        h = self.stream.begin(x, history) if self.stream is not None else x
        for block in self.blocks:
            h = block(h, history, self.rope, cache)
        if self.stream is not None:
            h = self.stream.end(h, history)
        if cache is not None:
            cache.advance(x.shape[1])
        return self.final(h)

    def new_cache(self, pad: torch.Tensor | None = None) -> KVCache:
        """An empty KV cache for this stack, as long as its RoPE table (``max_len``); ``pad``: each row's padding
        slots, for a left-padded batch."""
        return KVCache(len(self.blocks), self.max_len, pad)

    def incremental_decoding_conflict(self) -> str | None:
        """Why a KV-cached step (the new positions alone) would not compute what the whole sequence does, naming the
        component, or None: the norm strategy, residual type and projection type each answer for what they build
        (their ``incremental_decoding_conflict`` hook); attention is the one part that reads other positions, and
        the cache serves it."""
        cfg, plugins = self.cfg, self.plugins
        for kind, name, plugin in (("norm", cfg.norm, plugins.norm), ("residual", cfg.residual, plugins.residual),
                                   ("projection", cfg.projection, plugins.projection)):
            reason = plugin.incremental_decoding_conflict(self.info)
            if reason is not None:
                return f"{kind} {name!r} {reason}"
        return None

    @property
    def plugin_specs(self) -> list[registry.PluginSpec]:
        return self.plugins.specs

    @property
    def output_multiplier(self) -> float | None:
        """What the task model multiplies its head's input by (muP's readout), None for nothing."""
        multiplier = self.plugins.parametrization.output_multiplier(self.info)
        return None if multiplier == 1.0 else multiplier

    def parametrize(self, model: nn.Module) -> None:
        """Let the parametrization re-initialise each parameter and declare its optimizer scale, asked by role, on
        the whole task model (embedding and head included). Called once by the task model at the end of its
        ``__init__``."""
        parametrization = self.plugins.parametrization
        inside = {id(p) for p in self.blocks.parameters()}
        modules = dict(model.named_modules())
        # A parametrization that routes on roles cannot guess an undeclared parameter's; SP reads none.
        roles = parameter_roles(model, strict=parametrization.needs_roles)
        try:
            parametrization.check_roles({p.role for p in roles}, self.info)
            roles = self._with_width_ratios(roles)
        except ValueError as exc:
            raise ArchitectureError(f"parametrization {self.cfg.parametrization!r}: {exc}") from exc
        for parameter in roles:
            with torch.no_grad():
                parametrization.reinitialize(parameter, self.info)
            scale = parametrization.optimizer_scale(parameter, self.info, in_blocks=id(parameter.param) in inside)
            owner, _, attr = parameter.name.rpartition(".")
            if scale is not None:  # a rule, even where it is 1 at this shape (the base): Muon decides from this
                declare_adam_rule(modules[owner], attr, self.cfg.parametrization)
                muon = parametrization.muon_scale(parameter, self.info, in_blocks=id(parameter.param) in inside)
                if muon is not None:
                    declare_muon_rule(modules[owner], attr, MuonRule(self.cfg.parametrization, muon, scale))
            if scale is not None and not scale.is_default:
                declare_optimizer_scale(modules[owner], attr, scale)

    def base_config(self, d_model: int, n_heads: int) -> TransformerConfig:
        """This stack's config at width ``d_model`` with ``n_heads`` heads: its MLP by its own rule there (SwiGLU's
        rounding included), or an explicit ``mlp_hidden`` in proportion (refused where that is no whole number)."""
        cfg, hidden = self.cfg, None
        if cfg.mlp_hidden is not None:
            hidden, remainder = divmod(cfg.mlp_hidden * d_model, cfg.d_model)
            if remainder or not hidden:
                raise ValueError(f"mlp_hidden={cfg.mlp_hidden} at d_model={cfg.d_model} has no base twin at width "
                                 f"{d_model} ({cfg.mlp_hidden}*{d_model}/{cfg.d_model} is no whole number); leave "
                                 f"mlp_hidden unset (the {cfg.mlp} rule) or make it proportional to d_model")
        return dataclasses.replace(cfg, d_model=d_model, n_heads=n_heads, mlp_hidden=hidden, parametrization="sp",
                                   parametrization_options={})

    def _with_width_ratios(self, roles: list[ParameterRole]) -> list[ParameterRole]:
        """Each parameter with its fan-in and fan-out ratios against its twin in this stack built at the
        parametrization's base shape (on the meta device: shapes only, no memory, no random numbers drawn).
        Parameters the task model owns (embedding, head) have no twin in the stack: a matrix reading the width
        (the head) has the fan-in ratio m_d = d_model / base width, one writing it (embedding) the fan-out ratio."""
        shape = self.plugins.parametrization.base_shape(self.info)
        if shape is None:
            return roles
        base_width, base_heads = shape
        try:
            with torch.device("meta"):
                base = TransformerStack(self.base_config(base_width, base_heads), causal=self.info.causal,
                                        max_len=self.max_len)
        except (ValueError, registry.PluginError) as exc:
            raise ValueError(f"this model at its base shape (d_model={base_width}, n_heads={base_heads}), which gives "
                             f"each matrix its width ratio, cannot be built: {exc}; choose a base width this "
                             f"architecture accepts") from exc
        ratios = width_ratios(self, base, roles)
        m_d = self.cfg.d_model / base_width
        out = []
        for p in roles:
            if id(p.param) in ratios:
                r_in, r_out = ratios[id(p.param)]
            elif p.kind in (Kind.HEAD, Kind.READOUT, Kind.HIDDEN):
                r_in, r_out = m_d, (m_d if p.kind == Kind.HIDDEN else 1.0)
            else:
                r_in, r_out = 1.0, (1.0 if p.kind == Kind.SCALAR else m_d)
            out.append(dataclasses.replace(p, fan_in_ratio=r_in, fan_out_ratio=r_out))
        return out

    def site(self, site: str, dim: int) -> nn.Module:
        """A model-level site for the task head (e.g. LOGITS), from this stack's norm strategy."""
        return _site(self.plugins.norm, site, dim, None, self.info)

    def constrain(self, module: nn.Module, role: str, param: str = "weight", dim: int = 1) -> None:
        """Declare a task model's own weight (embedding, head) unit-norm if the norm strategy says so."""
        if self.plugins.norm.constrains(role):
            declare_unit_norm(module, param, dim)
