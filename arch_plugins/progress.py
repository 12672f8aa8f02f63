"""Running the training-progress hooks that modules declared (``declare_progress_hook``, in
``arch_plugins.declarations``, re-exported here).

Some components change with the step count: SLAB's PRepBN moves from LayerNorm to BatchNorm over a
schedule of steps, BHyT recomputes its variance approximation from the weights every few steps, the
LayerNorm-removal procedure switches norms off one by one. Each such module declares a hook; whatever
runs the training loop (in this project a Lightning callback, ``lit/callbacks/training_progress.py``)
calls every declared hook once per optimizer step, before that step's first forward pass, with the
number of optimizer steps already taken and the number the run will take:

    declare_progress_hook(self, MyNorm.on_progress)     # called as fn(module, progress)

A hook must only depend on ``progress`` (not on how often it was called): a resumed run calls it at the
step it resumes from, and then at every step, as an uninterrupted run does. It runs on every process
with the same argument, so it must not start collectives (a module that needs the weights' values waits
for its next forward pass, where FSDP2 has them gathered).

Pure PyTorch: nothing here knows about Lightning.
"""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn

from arch_plugins.declarations import (
    ProgressHook,
    TrainingProgress,
    declare_progress_hook,
    has_progress_hooks,
    progress_hooks,
)

__all__ = ["ProgressHook", "TrainingProgress", "declare_progress_hook", "has_progress_hooks", "progress_hooks",
           "advance", "run_hooks"]


def advance(model: nn.Module, progress: TrainingProgress) -> int:
    """Call every declared hook with ``progress``; returns how many ran."""
    return run_hooks(progress_hooks(model), progress)


def run_hooks(hooks: Iterable[tuple[str, nn.Module, ProgressHook]], progress: TrainingProgress) -> int:
    """Call the hooks ``progress_hooks`` found (collected once, e.g. for a whole run); returns how many ran."""
    count = 0
    for _, module, fn in hooks:
        fn(module, progress)
        count += 1
    return count
