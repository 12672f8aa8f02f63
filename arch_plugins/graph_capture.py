"""A module that cannot run inside a captured CUDA graph says so, and why; whoever captures asks the model.

A CUDA graph records a training step's kernels once and replays them; everything the step does must be a kernel on
the device at fixed addresses, run once per replay. A plugin that keeps state the replay would not update as eager
code does (a buffer written in a custom backward, a Python value read from the device to choose a branch, a tensor
swapped for a new one outside the step) declares it where it is built:

    declare_not_capturable(self, "powernorm", "its custom backward writes running statistics (ema_gz) in place")

and the code that would capture (``lit/compile_mode.py``'s ``auto``) walks the model with ``capture_refusals`` and
compiles without graphs instead, naming the plugin and the reason. The block and the task name no plugin.

Stored as every other declaration (``arch_plugins/declarations.py``): a plain attribute, which survives compile and
FSDP wrapping, costs nothing in forward and is not saved in checkpoints. Pure PyTorch: nothing here knows Lightning.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from arch_plugins.declarations import _declare, _walk

_WHAT = "graph_capture"


@dataclass(frozen=True)
class CaptureRefusal:
    """A module that cannot be captured: the plugin it belongs to (its registered name) and why."""

    plugin: str
    reason: str
    module: str = ""  # its path in the model ("stack.blocks.0.attn_in"), filled in by ``capture_refusals``


def declare_not_capturable(module: nn.Module, plugin: str, reason: str) -> None:
    """Declare that ``module`` must not run inside a captured CUDA graph; ``reason`` says what would go wrong."""
    _declare(module, _WHAT, "refusal", CaptureRefusal(plugin, reason))


def capture_refusals(model: nn.Module) -> list[CaptureRefusal]:
    """One refusal per (plugin, reason) in ``model``, with the first module path that declared it."""
    found: dict[tuple[str, str], CaptureRefusal] = {}
    for path, _module, _key, refusal in _walk(model, _WHAT):
        found.setdefault((refusal.plugin, refusal.reason), CaptureRefusal(refusal.plugin, refusal.reason, path))
    return list(found.values())
