"""Modules whose behaviour follows training progress declare it themselves, as unit-norm weights do.

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

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from torch import nn

_ATTR = "progress_hooks"


@dataclass(frozen=True)
class TrainingProgress:
    """Where training stands when the hooks are called.

    ``step``: optimizer steps taken so far (0 before the first); ``total_steps``: optimizer steps the run
    will take, None when the loop does not know (an epoch-bounded run over an iterable of unknown length).
    """

    step: int
    total_steps: int | None = None

    def fraction(self) -> float | None:
        return None if not self.total_steps else min(1.0, self.step / self.total_steps)


ProgressHook = Callable[[nn.Module, TrainingProgress], None]


def declare_progress_hook(module: nn.Module, fn: ProgressHook) -> None:
    """Declare that ``fn(module, progress)`` must run once per optimizer step, before its forward pass.

    ``fn`` receives the module (not a closure over it, so no reference cycle is made and the model stays
    picklable). One hook per module: a later declaration replaces an earlier one.
    """
    # A plain attribute (not a buffer, not a submodule): it survives FSDP/compile wrapping, is not saved in
    # checkpoints, and costs nothing in the forward pass.
    object.__setattr__(module, _ATTR, fn)


def progress_hooks(model: nn.Module) -> Iterator[tuple[str, nn.Module, ProgressHook]]:
    """Every declared (module path, module, hook) of ``model``, in module order."""
    for name, module in model.named_modules():
        fn = getattr(module, _ATTR, None)
        if fn is not None:
            yield name, module, fn


def has_progress_hooks(model: nn.Module) -> bool:
    return next(progress_hooks(model), None) is not None


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
