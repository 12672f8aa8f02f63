"""Stabilisers that combine with any norm strategy: QK-norm and a logit soft-cap on top of the strategy's sites.

They are not a norm strategy of their own: a researcher studies DyT or Peri-LN *with* QK-norm, so the stack wraps
whichever strategy was selected (``with_stabilisers``) and the block, which calls the strategy's hooks, never names
them. The wrapper adds a module at two hooks and passes everything else through unchanged:

- ``qk_before_rope``: QK-norm per head, before RoPE, where Qwen3, Gemma 3 and OLMo 2 put it. A strategy that
  transforms q and k itself (its ``qk`` or ``qk_before_rope`` returns a module: nGPT's hypersphere normalises them
  and learns their scale) is refused with one line: normalising again would undo what the strategy learns.
- ``site(logits)``: the soft-cap after whatever the strategy puts on the logits (nGPT's s_z scales, then the cap
  bounds), attached to the strategy's module so that its parameters keep their names.

- ``attention_probs``: the clipped softmax (Quantizable Transformers) in place of the softmax. A strategy that
  replaces the softmax itself is refused with one line.
- ``attention_gate``: gated attention (Quantizable Transformers), a per-head sigmoid gate on the heads' outputs.

z-loss belongs to the loss, not the model: ``z_loss.z_loss`` is what ``LanguageModel`` adds.
With no stabiliser set, ``with_stabilisers`` returns the strategy itself: the model is exactly the old one.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from arch_plugins.interfaces import NormStrategy, Site, StackInfo
from arch_plugins.registry import PluginError
from arch_plugins.stabilisers.clipped_softmax import ClippedSoftmax
from arch_plugins.stabilisers.gated_attention import HeadGate
from arch_plugins.stabilisers.logit_softcap import LogitSoftCap
from arch_plugins.stabilisers.qk_norm import QK_NORMS, QKNorm


class Stabilised:
    """A norm strategy with QK-norm and/or a logit soft-cap added; every other hook is the strategy's own.

    Deliberately not a ``NormStrategy`` subclass: attribute look-ups fall through to the wrapped strategy, so a
    hook the interface gains later reaches the strategy instead of the base class's identity default.
    """

    def __init__(self, strategy: NormStrategy, name: str, *, qk_norm: str | None, qk_norm_eps: float,
                 logit_softcap: float | None, clipped_softmax: tuple[float, float] | None = None,
                 gated_attention_init: float | None | bool = False):
        self.strategy, self.name = strategy, name
        self.qk_norm, self.qk_norm_eps, self.logit_softcap = qk_norm, qk_norm_eps, logit_softcap
        # (gamma, zeta) or None; the gate's init opening, None for nn.Linear's bias, False for no gate.
        self.clipped_softmax, self.gated_attention_init = clipped_softmax, gated_attention_init

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") or attr == "strategy":  # copy/pickle probe dunders before __dict__ is filled
            raise AttributeError(attr)
        return getattr(self.strategy, attr)

    def qk_before_rope(self, layer: int, stack: StackInfo) -> nn.Module | None:
        own = self.strategy.qk_before_rope(layer, stack)
        if self.qk_norm is None:
            return own
        if own is not None or self.strategy.qk(layer, stack) is not None:
            raise PluginError(f"norm {self.name!r} already transforms q and k itself (its qk hook); qk_norm on top "
                              f"would normalise away what it learns: unset model.arch.qk_norm or pick another norm")
        return QKNorm(self.qk_norm, stack.head_dim, self.qk_norm_eps)

    def attention_probs(self, layer: int, stack: StackInfo) -> nn.Module | None:
        own = self.strategy.attention_probs(layer, stack)
        if self.clipped_softmax is None:
            return own
        if own is not None:
            raise PluginError(f"norm {self.name!r} already replaces the attention softmax; clipped softmax on top "
                              f"would discard it: unset model.arch.clipped_softmax_gamma or pick another norm")
        return ClippedSoftmax(*self.clipped_softmax)

    def attention_gate(self, layer: int, stack: StackInfo) -> nn.Module | None:
        own = self.strategy.attention_gate(layer, stack)
        if self.gated_attention_init is False:
            return own
        if own is not None:
            raise PluginError(f"norm {self.name!r} already gates the attention heads; unset "
                              f"model.arch.gated_attention or pick another norm")
        return HeadGate(stack.num_heads, stack.head_dim, self.gated_attention_init)

    def site(self, site: str, dim: int, layer: int | None, stack: StackInfo) -> nn.Module | None:
        module = self.strategy.site(site, dim, layer, stack)
        if site != Site.LOGITS or self.logit_softcap is None:
            return module
        return cap_after(module, LogitSoftCap(self.logit_softcap))


def cap_after(module: nn.Module | None, cap: LogitSoftCap) -> nn.Module:
    """``module`` followed by ``cap``, with ``module``'s parameter names unchanged (a container would prefix them,
    so a checkpoint or a diagnostic name would differ between runs with and without the cap)."""
    if module is None:
        return cap
    module.softcap = cap  # a child without parameters: shown in the model's repr, nothing in its state dict
    module.register_forward_hook(_apply_softcap)
    return module


def _apply_softcap(module: nn.Module, inputs, output):
    return module.softcap(output)


def with_stabilisers(strategy: NormStrategy, name: str, *, qk_norm: str | None = None, qk_norm_eps: float = 1e-6,
                     logit_softcap: float | None = None, clipped_softmax_gamma: float | None = None,
                     clipped_softmax_zeta: float = 1.0, gated_attention: bool = False,
                     gated_attention_init: float | None = 0.25) -> NormStrategy | Stabilised:
    """``strategy`` with the stabilisers asked for, or ``strategy`` itself when none is."""
    if qk_norm is not None and qk_norm not in QK_NORMS:
        raise PluginError(f"qk_norm must be one of {', '.join(QK_NORMS)} or null (off), got {qk_norm!r}")
    if not qk_norm_eps > 0:
        raise PluginError(f"qk_norm_eps must be positive, got {qk_norm_eps!r}")
    if logit_softcap is not None:
        try:
            LogitSoftCap(logit_softcap)
        except ValueError as exc:
            raise PluginError(str(exc)) from exc
    clipped = None
    if clipped_softmax_gamma is not None:
        try:
            ClippedSoftmax(clipped_softmax_gamma, clipped_softmax_zeta)
        except ValueError as exc:
            raise PluginError(str(exc)) from exc
        clipped = (float(clipped_softmax_gamma), float(clipped_softmax_zeta))
    if gated_attention:
        try:
            HeadGate(1, 1, gated_attention_init)
        except ValueError as exc:
            raise PluginError(str(exc)) from exc
    if qk_norm is None and logit_softcap is None and clipped is None and not gated_attention:
        return strategy
    return Stabilised(strategy, name, qk_norm=qk_norm, qk_norm_eps=qk_norm_eps, logit_softcap=logit_softcap,
                      clipped_softmax=clipped, gated_attention_init=gated_attention_init if gated_attention else False)
