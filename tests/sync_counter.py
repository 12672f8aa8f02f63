"""Counts, per training step, what would make the host wait for a GPU: a callback named on a real `fit`'s command line.

    --trainer.callbacks='[{class_path: tests.sync_counter.CountSyncs, init_args: {out: syncs.json}}]'

What it catches (the outside review's method, ``../shared/specs/gpu-readiness.md`` appendix A):

- device -> host reads: the aten ops whose result the host must wait for (``_local_scalar_dense``, behind ``.item()``,
  ``bool(t)``, ``float(t)`` and a tensor-valued ``if``; ``nonzero``, ``masked_select``, ``unique``,
  ``repeat_interleave`` with a tensor of repeats, indexing by a boolean mask, ``equal``, ``is_nonzero``), seen by a
  ``TorchDispatchMode``; and ``Tensor.tolist/.cpu/.numpy/.item``, patched (some never reach the dispatcher);
- host -> device copies of host values: ``torch.tensor``/``torch.as_tensor`` given a ``torch.device`` (how
  ``self.log(float)`` and collective flags put a Python number where the model lives; the string ``"cpu"`` asks for
  host memory on purpose and is not counted), and ``Tensor.to`` of a host tensor;
- collectives called from Python (``torch.distributed.all_reduce`` and friends): each makes every process wait for
  the slowest, and on a GPU needs its flag on the device first.

Which reads count. On a CPU every tensor is a host tensor, so a read of the optimizer's step counter (a CPU tensor
on a GPU too) looks like a read of the loss. Instead of classifying events by their call site, the counter follows
where values come from: a tensor is a *device tensor* when it would live on the accelerator in a GPU run, that is
when it derives from the model's parameters, buffers and gradients or from the batch (the seeds, marked at the start
of training, of each batch and after each backward pass), through any chain of aten ops (every output of an op with
a device-tensor input is one; an in-place op marks the tensor it writes). A read counts when its input is a device
tensor. Counters the optimizer keeps on the host (``state["step"]``, created by ``torch.tensor(0.0)`` from no device
tensor) are not device tensors by this rule, and the same code reads them on a GPU without a sync. The batch's own
transfer (Lightning's ``batch_to_device``) is not counted: on a GPU it is a ``non_blocking`` copy from pinned memory
(``lit/data/text.py``).

Each event is attributed to the optimizer step (``global_step`` at the batch's start) and micro-batch it happened in;
events after a batch's end (validation, checkpoints) go to that batch's step. ``out`` gets a JSON list per process
(``<out>.rank<N>`` for ranks above 0).
"""

from __future__ import annotations

import json
import threading
import traceback
from pathlib import Path

import lightning as L
import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

aten = torch.ops.aten
READ_OPS = {aten._local_scalar_dense.default, aten.nonzero.default, aten.masked_select.default,
            aten.repeat_interleave.Tensor, aten._unique2.default, aten.unique_dim.default,
            aten.unique_consecutive.default, aten.equal.default, aten.is_nonzero.default}
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast", "barrier",
               "reduce")
REPO = Path(__file__).resolve().parents[1]


def _site() -> str:
    """The innermost frame outside torch and this file: this repository's code (``lit/task.py:88``) or Lightning's."""
    for frame in reversed(traceback.extract_stack()[:-3]):
        path = Path(frame.filename)
        if "/torch/" in frame.filename or path.name == "sync_counter.py":
            continue
        return f"{path.relative_to(REPO) if REPO in path.parents else frame.filename.split('site-packages/')[-1]}" \
               f":{frame.lineno}"
    return "?"


class _Tracker(TorchDispatchMode):
    def __init__(self, counter: CountSyncs):
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        tainted = any(self.counter.is_device(t) for t in inputs)
        if tainted and not self.counter.inside_patch():
            if func in READ_OPS:
                self.counter.event(f"read:{func.__name__}")
            elif func is aten.index.Tensor and any(
                    isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in args[1]):
                self.counter.event("read:index_by_mask")
        out = func(*args, **kwargs)
        if tainted:
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    self.counter.mark(t)
            if func._schema.is_mutable and inputs:  # an in-place op writes device values into its first argument
                self.counter.mark(inputs[0])
        return out


class CountSyncs(L.Callback):
    """Args:
        out: where the events go (JSON: a list of {step, micro, kind, site}).
    """

    def __init__(self, out: str):
        self.out = out
        self.events: list[dict] = []
        self._device = WeakIdKeyDictionary()
        self._local = threading.local()
        self._step, self._micro, self._mode, self._originals = -1, 0, None, {}

    # --- device tensors ------------------------------------------------------------------------------------------

    def mark(self, t: torch.Tensor) -> None:
        self._device[t] = True

    def is_device(self, t: torch.Tensor) -> bool:
        return t in self._device

    def inside_patch(self) -> bool:
        return getattr(self._local, "depth", 0) > 0

    def event(self, kind: str) -> None:
        self.events.append({"step": self._step, "micro": self._micro, "kind": kind, "site": _site()})

    # --- patches -----------------------------------------------------------------------------------------------------

    def _patch(self, owner, name: str, kind: str, should_count, to_device: bool = False) -> None:
        original = getattr(owner, name)
        self._originals[(owner, name)] = original
        counter = self

        def patched(*args, **kwargs):
            depth = getattr(counter._local, "depth", 0)
            counted = depth == 0 and should_count(*args, **kwargs)
            if counted:
                counter.event(f"{kind}:{name}")
            counter._local.depth = depth + 1
            try:
                out = original(*args, **kwargs)
            finally:
                counter._local.depth = depth
            if counted and to_device and isinstance(out, torch.Tensor):
                counter.mark(out)  # a host value sent to the device is a device tensor from then on
            return out

        setattr(owner, name, patched)

    def _install(self) -> None:
        for name in ("tolist", "cpu", "numpy", "item"):
            self._patch(torch.Tensor, name, "read", lambda t, *a, **k: self.is_device(t))

        def explicit_device(*args, **kwargs):
            # A torch.device comes from where the model lives (a module, a parameter, the strategy); the string
            # "cpu" asks for host memory on purpose (the optimizer's step counters), on a GPU too.
            return isinstance(kwargs.get("device"), torch.device)

        for name in ("tensor", "as_tensor"):
            self._patch(torch, name, "host->device", explicit_device, to_device=True)

        def host_to_device(t, *args, **kwargs):
            if self.is_device(t) or kwargs.get("non_blocking") or any(a is True for a in args[1:]):
                return False
            target = kwargs.get("device", args[0] if args else None)
            if isinstance(target, torch.Tensor):
                target = target.device
            if not isinstance(target, torch.device):  # as above: a "cpu" string asks for host memory
                return False
            # The batch's transfer: on a GPU a non_blocking copy from pinned memory (module docstring).
            return "apply_func.py" not in "".join(f.filename for f in traceback.extract_stack()[-6:])

        self._patch(torch.Tensor, "to", "host->device", host_to_device, to_device=True)
        if dist.is_available():
            for name in COLLECTIVES:
                if hasattr(dist, name):
                    self._patch(dist, name, "collective", lambda *a, **k: dist.is_initialized())

    def _uninstall(self) -> None:
        for (owner, name), original in self._originals.items():
            setattr(owner, name, original)
        self._originals.clear()

    # --- hooks -------------------------------------------------------------------------------------------------------

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for t in [*pl_module.parameters(), *pl_module.buffers()]:
            self.mark(t)
        self._install()
        self._mode = _Tracker(self)
        self._mode.__enter__()

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        step = trainer.global_step
        self._micro = self._micro + 1 if step == self._step else 0
        self._step = step
        for t in tree_flatten(batch)[0]:
            if isinstance(t, torch.Tensor):
                self.mark(t)

    def on_after_backward(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._mark_grads(pl_module)

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer) -> None:
        self._mark_grads(pl_module)

    def _mark_grads(self, pl_module: L.LightningModule) -> None:
        # Autograd stores a parameter's first gradient outside the dispatcher: marked here, before anything reads it.
        for p in pl_module.parameters():
            if p.grad is not None:
                self.mark(p.grad)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._stop(trainer)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._stop(trainer)

    def _stop(self, trainer: L.Trainer) -> None:
        if self._mode is not None:
            self._mode.__exit__(None, None, None)
            self._mode = None
        self._uninstall()
        out = Path(self.out if trainer.global_rank == 0 else f"{self.out}.rank{trainer.global_rank}")
        out.write_text(json.dumps(self.events))
