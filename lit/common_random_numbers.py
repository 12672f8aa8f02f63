"""Common random numbers by name: every random number a model draws is keyed by (seed, where it goes), not by
the order in which the model happens to be built.

Why: a sweep pairs a variant with the baseline by seed, and the pairing only buys power when the two runs share
their noise. Under the construction-order rule (``torch.manual_seed(seed)`` and then build), a variant that adds
one module before the others (a hyper-connection's stream weights, LAUREL's low-rank matrices, a new norm's
gain) shifts the global random stream, and every later parameter of the variant starts from other numbers than
the baseline's: the two runs are paired by name only. Under ``by_name`` a parameter the two models share starts
bit-identical whatever else either model holds, and a dropout mask is drawn from a stream keyed by the module's
path and the training batch, so masks agree wherever the shapes agree.

How the init is keyed, without touching any component: the model is built twice. The first build records, at
the dispatcher, every random operator call and where its values flow (through copies, views, arithmetic) and
which parameter or buffer they end in; the call is then named after that tensor (the first name in sorted order
when they end in several). The second build runs the same code, and each random call draws from a generator
seeded by (seed, its name, how many calls of that name came before it). Components are written as ordinary
PyTorch (``nn.init.normal_``, ``torch.randn(...) * std``, ``orthogonal_``) and are keyed all the same. A random
call whose values end in no parameter (scratch) is keyed by its rank among such calls. Only torch's generator
is keyed: a component that draws from numpy or Python's ``random`` at build time is not.

Rules by name (recorded in a sweep's protocol as ``random_numbers``):
    ``construction_order``  seed the global generator once and build (PyTorch's default; every recipe's default)
    ``by_name``             the keyed build above, and training-time streams keyed per module and batch
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Callable

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

BY_NAME, CONSTRUCTION_ORDER = "by_name", "construction_order"
RULES = (BY_NAME, CONSTRUCTION_ORDER)
SCRATCH = "(no parameter)"  # the name of random calls whose values end in no parameter or buffer
UNSTABLE_BUILD = ("the model's two builds drew different random numbers (its construction depends on something "
                  "other than its config); build it with random_numbers=construction_order")


def keyed_seed(*parts: object) -> int:
    """A 63-bit seed from any parts: stable across processes and Python versions (not ``hash``)."""
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def _is_random(func) -> bool:
    return torch.Tag.nondeterministic_seeded in func.tags


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def _tensors(tree) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


class _RecordFlows(TorchDispatchMode):
    """First build: which random calls each storage's values come from."""

    def __init__(self):
        super().__init__()
        self.calls: list[object] = []  # the operator of each random call, in order
        self.sources: dict[int, frozenset[int]] = {}  # storage -> indices of the random calls it depends on
        self._alive: list[torch.UntypedStorage] = []  # held so that no storage id is reused during the build

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        sources: set[int] = set()
        for t in _tensors((args, kwargs)):
            sources |= self.sources.get(_storage(t), frozenset())
        if _is_random(func):
            sources.add(len(self.calls))
            self.calls.append(func)
        if sources:
            for t in _tensors(out):
                key = _storage(t)
                if key not in self.sources:
                    self._alive.append(t.untyped_storage())
                self.sources[key] = self.sources.get(key, frozenset()) | frozenset(sources)
        return out


class _DrawByName(TorchDispatchMode):
    """Second build: each random call draws from a generator keyed by (seed, its name, its rank in that name)."""

    def __init__(self, seed: int, names: list[str], calls: list[object]):
        super().__init__()
        self.seed, self.names, self.calls = seed, names, calls
        self.index = 0
        self.rank: dict[str, int] = defaultdict(int)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not _is_random(func):
            return func(*args, **kwargs)
        if self.index >= len(self.calls) or self.calls[self.index] != func:
            raise RuntimeError(UNSTABLE_BUILD)
        name = self.names[self.index]
        self.index += 1
        rank = self.rank[name]
        self.rank[name] += 1
        devices = {t.device for t in _tensors((args, kwargs))}
        if isinstance(kwargs.get("device"), torch.device):  # a creation op (randn, rand) says where it draws
            devices.add(kwargs["device"])
        cuda = sorted({d.index if d.index is not None else torch.cuda.current_device()
                       for d in devices if d.type == "cuda"})
        with torch.random.fork_rng(devices=cuda):
            torch.manual_seed(keyed_seed(self.seed, name, rank))
            return func(*args, **kwargs)


def _call_names(model: nn.Module, recorder: _RecordFlows) -> list[str]:
    """The name of each random call of the first build: the (first, sorted) tensor its values end in."""
    owner: dict[int, list[str]] = defaultdict(list)
    for name, t in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        owner[_storage(t)].append(name)
    ends: dict[int, set[str]] = defaultdict(set)
    for storage, calls in recorder.sources.items():
        for call in calls:
            ends[call].update(owner.get(storage, ()))
    names, scratch = [], 0
    for call in range(len(recorder.calls)):
        if ends[call]:
            names.append(min(ends[call]))
        else:
            names.append(f"{SCRATCH} {scratch}")
            scratch += 1
    return names


def build(factory: Callable[[], nn.Module], rule: str, seed: int | None = None) -> nn.Module:
    """``factory()`` under a rule of ``RULES``; ``seed`` defaults to the global one (``torch.initial_seed()``,
    which ``seed_everything`` set). After a keyed build the global generator is reseeded from the seed alone, so
    what draws from it next does not depend on the model either."""
    if rule not in RULES:
        raise ValueError(f"random_numbers must be one of {', '.join(RULES)}, got {rule!r}")
    if rule == CONSTRUCTION_ORDER:
        return factory()
    seed = torch.initial_seed() if seed is None else seed
    with torch.random.fork_rng(devices=[]):
        recorder = _RecordFlows()
        with recorder:
            first = factory()
        names = _call_names(first, recorder)
        del first, recorder._alive
    with _DrawByName(seed, names, recorder.calls) as drawing:
        model = factory()
    if drawing.index != len(names):
        raise RuntimeError(UNSTABLE_BUILD)
    torch.manual_seed(keyed_seed(seed, "after the build"))
    return model


# The forwards of torch's own layers that never draw a random number. A module that runs one of them (its class, or a
# subclass that keeps it, as the projections' Linear) gets no hook: a module that draws nothing is invisible to the
# streams (each hooked module hands its caller's stream back when it returns), so hooking it only costs time, about
# 10 us a call on a CPU. A subclass with a forward of its own is hooked: it may draw there.
QUIET = frozenset(layer.forward for layer in (
    nn.Identity, nn.Linear, nn.Embedding, nn.LayerNorm, nn.RMSNorm, nn.GroupNorm, nn.BatchNorm1d, nn.BatchNorm2d,
    nn.Conv1d, nn.Conv2d, nn.Sequential, nn.Flatten, nn.GELU, nn.ReLU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.Softmax))


class RuntimeStreams:
    """Training-time random numbers (dropout masks, stochastic layers) keyed by (seed, rank, batch, module path).

    Each module draws from a stream of its own: a forward pre-hook reseeds the global generator from the module's
    path and the batch when the module is entered, and a forward hook gives the caller's stream back, where it
    was, when the module returns. So a module's draws depend on its own path and the batch, not on how many
    numbers other modules drew before it, nor on the children it calls before drawing (attention draws its
    dropout after calling ``rope`` and its q/k norms: without the hand-back it drew from the stream of the child
    entered last, ``stack.rope`` in every layer, so every layer had the same mask). Masks agree across variants
    wherever a module of the same path draws the same shape. Recomputation under activation checkpointing sees
    the same key, hence the same masks. A module called twice in one batch (a block's ``drop`` and ``drop_path``
    serve both sublayers) is reseeded alike at each call, so both calls draw the same numbers.

    Modules that run the forward of one of torch's layers that cannot draw (``QUIET``) are not hooked. Under
    ``compile`` (hooks inside a compiled model would break its graph) only the batch keys the stream: masks then
    agree while the variants draw in the same order.
    """

    def __init__(self, model: nn.Module, seed: int, rank: int = 0, per_module: bool = True):
        self.seed, self.rank, self.batch_key = seed, rank, 0
        # Asked once: under Lightning (PYTORCH_NVML_BASED_CUDA_CHECK=1) every torch.cuda.is_available() call
        # loads and queries the NVML library, which, per module call, cost more than a micro-size CPU step.
        self.cuda = torch.cuda.is_available()
        self.handles = []
        self._callers: list = []  # the generator state of each hooked module's caller, innermost last
        if per_module:
            for path, module in model.named_modules():
                if type(module).forward in QUIET:
                    continue
                enter, leave = self._hooks(keyed_seed(path or "(model)"))
                self.handles.append(module.register_forward_pre_hook(enter))
                # always_call: a forward that raises (checkpoint's early stop of a recomputation does) still hands
                # its caller's stream back.
                self.handles.append(module.register_forward_hook(leave, always_call=True))

    def _hooks(self, path_key: int):
        cpu, callers = torch.default_generator, self._callers

        # The CPU-only pair is the common case on a CPU run: it runs at every module call, and its cost is mostly
        # Python's (a Mersenne Twister reseed ~4.5 us, get_state ~4 us, set_state ~1 us).
        def enter(module: nn.Module, args) -> None:
            if module.training:
                callers.append(cpu.get_state())
                cpu.manual_seed(self.batch_key ^ path_key)

        def leave(module: nn.Module, args, output) -> None:
            if module.training:
                cpu.set_state(callers.pop())

        if not self.cuda:
            return enter, leave

        def enter_cuda(module: nn.Module, args) -> None:
            if module.training:
                device = torch.cuda.default_generators[torch.cuda.current_device()] \
                    if torch.cuda.is_initialized() else None
                callers.append((cpu.get_state(), device, device.get_state() if device is not None else None))
                seed = self.batch_key ^ path_key
                cpu.manual_seed(seed)
                if device is not None:
                    device.manual_seed(seed)

        def leave_cuda(module: nn.Module, args, output) -> None:
            if module.training:
                state, device, device_state = callers.pop()
                cpu.set_state(state)
                if device is not None:
                    device.set_state(device_state)

        return enter_cuda, leave_cuda

    def _reseed(self, path_key: int) -> None:
        # Two independent 63-bit hashes combined by XOR: one sha256 per batch, not one per module call (the hook
        # runs before every module's forward, so its cost is per call).
        seed = self.batch_key ^ path_key
        torch.default_generator.manual_seed(seed)
        if self.cuda and torch.cuda.is_initialized():
            torch.cuda.default_generators[torch.cuda.current_device()].manual_seed(seed)

    def start_batch(self, batch: int) -> None:
        """Called before each training batch (its index counted over the whole run)."""
        self._callers.clear()  # nothing is left there after a forward; cleared all the same
        self.batch_key = keyed_seed(self.seed, self.rank, batch)
        self._reseed(keyed_seed("(batch)"))

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
