"""``--model.compile``: what a run asks for, and what ``auto`` (the default) becomes on the machine it runs on.

- ``false``: eager.
- ``true``: ``torch.compile`` with Inductor's default mode (the whole model as one graph; each block under FSDP2).
- ``reduce-overhead``: ``torch.compile`` with CUDA graphs: a small model's training step, which pays its kernel
  launches more than its math on a GPU, replayed as recorded graphs. Validation, prediction and logging run outside
  the graphs (``lit/parallel.py``'s ``compile_model``). On a CPU Inductor captures nothing, so it is ``true`` there.
- ``auto``: eager on a CPU, so a CPU run's numbers are those it had before ``auto`` existed and it pays no compile
  (minutes per child cold on a loaded 2-core CPU: docs/performance/compile-cache.md); on CUDA, ``reduce-overhead``
  for a one-process run of a model under ``CUDA_GRAPH_MAX_PARAMETERS`` parameters, ``true`` otherwise.

Where CUDA graphs were chosen (by ``auto`` or asked for) and cannot hold the step, the run compiles with ``true``
and one warning says why: a plugin that declared it cannot be captured (``arch_plugins/graph_capture.py``), or
gradient accumulation. A CPU run asked for ``reduce-overhead`` is ``true`` in effect (Inductor records no graph on
a CPU), which lets a CPU test check everything of the graph path but the capture itself.

The threshold is a judgement, not a measurement (no GPU was lent when it was set; docs/performance/compile-cache.md
says what was and was not measured). The GPU check measured the baseline recipe's model at 8 layers (d 128, 1.7M
parameters, 16 x 64 tokens) host-bound on an H200 (27 ms a step, docs/performance/gpu.md stage B), and GPT-2
small's shape (162M parameters, untied) at 34% MFU compiled without graphs; 50M sits between, above every model of
the reproduction and of the CPU ladders.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch import nn

from arch_plugins.graph_capture import capture_refusals
from lit.errors import UserInputError

EAGER, DEFAULT, GRAPHS, AUTO = False, True, "reduce-overhead", "auto"
CUDA_GRAPH_MAX_PARAMETERS = 50_000_000
_WORDS = {"false": EAGER, "true": DEFAULT, GRAPHS: GRAPHS, AUTO: AUTO}

CompileOption = bool | str  # what the LightningModules' ``compile`` argument takes (jsonargparse reads true/false)


def parse(value: object) -> bool | str:
    """``value`` as one of False, True, "reduce-overhead", "auto"; anything else is a one-line user error."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _WORDS:
        return _WORDS[value.strip().lower()]
    raise UserInputError(f"--model.compile takes true, false, reduce-overhead or auto (the default), got {value!r}")


@dataclass(frozen=True)
class Resolution:
    """What a run compiles with (False, True or "reduce-overhead") and why, for the run's startup line."""

    mode: bool | str
    why: str

    @property
    def label(self) -> str:
        return {False: "false", True: "true"}.get(self.mode, self.mode)  # type: ignore[arg-type]


def resolve(requested: bool | str, model: nn.Module, device: torch.device, processes: int = 1,
            micro_batches: int = 1) -> Resolution:
    """The mode ``requested`` (already parsed) runs ``model`` with on ``device``, with ``processes`` processes and
    ``micro_batches`` per optimizer step (gradient accumulation)."""
    if requested is not AUTO and requested != GRAPHS:
        return Resolution(requested, "as asked")
    if requested == AUTO:
        if device.type != "cuda":
            return Resolution(EAGER, f"auto on {device.type}: eager")
        parameters = sum(p.numel() for p in model.parameters())
        if processes > 1:
            return Resolution(DEFAULT, f"auto on cuda with {processes} processes: compiled without CUDA graphs")
        if parameters >= CUDA_GRAPH_MAX_PARAMETERS:
            return Resolution(DEFAULT, f"auto on cuda: {parameters / 1e6:.1f}M parameters, at least "
                                       f"{CUDA_GRAPH_MAX_PARAMETERS / 1e6:.0f}M: compiled without CUDA graphs")
        why = f"auto on cuda: {parameters / 1e6:.1f}M parameters, under {CUDA_GRAPH_MAX_PARAMETERS / 1e6:.0f}M"
    else:
        why = "as asked"
    if micro_batches > 1:
        # The first micro-batch's gradients would live in the graphs' memory, which the next micro-batch's replay
        # overwrites before they are accumulated into (torch's cudagraph_trees refuses to read them then).
        reason = f"{micro_batches} micro-batches per step accumulate gradients across graph replays"
        warnings.warn(f"--model.compile: no CUDA graphs, compiled with mode true instead: {reason}", stacklevel=2)
        return Resolution(DEFAULT, f"{why}; {reason}")
    refusals = capture_refusals(model)
    if refusals:
        named = "; ".join(f"{r.plugin} ({r.module}): {r.reason}" for r in refusals)
        warnings.warn(f"--model.compile: no CUDA graphs for this model, compiled with mode true instead: {named}",
                      stacklevel=2)
        return Resolution(DEFAULT, f"{why}; CUDA graphs refused by {', '.join(r.plugin for r in refusals)}")
    return Resolution(GRAPHS, why)
