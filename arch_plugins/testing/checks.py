"""The conformance checks, one function each: what every plugin of every kind must do to behave like the built-ins.

Each check receives a ``Subject`` (the plugin, its options, the stacks to build it into) and either returns (pass),
raises ``AssertionError`` with what went wrong (fail), or raises ``Skipped`` with why it does not apply.
"""

from __future__ import annotations

import copy
import inspect
import io
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from arch_plugins import catalogue, registry
from arch_plugins.init_identity import InitIdentity, init_identities
from arch_plugins.meta_device import meta_memo
from arch_plugins.progress import has_progress_hooks
from arch_plugins.testing.stacks import Built, KindNotTaken, Size, StackBuilder


class Skipped(Exception):
    """The check does not apply to this plugin; ``str(e)`` says why."""


@dataclass
class Subject:
    kind: str
    name: str
    stacks: Mapping[str, StackBuilder]
    options: Mapping[str, Any] = field(default_factory=dict)
    size: Size = field(default_factory=Size)

    def build(self, stack: str, seed: int, name: str | None = None, options: Mapping[str, Any] | None = None) -> Built:
        """The plugin (or ``name`` of the same kind) in ``stack``, every other component at its default."""
        torch.manual_seed(seed)
        name = name or self.name
        # Options a plugin states it needs in a stack that its defaults refuse (3PT's position profile in an encoder).
        needed = getattr(registry.load(self.kind, name), "stack_options", {}).get(stack, {})
        chosen = (name, {**needed, **dict(self.options if options is None else options)})
        try:
            return self.stacks[stack]({self.kind: chosen}, self.size)
        except KindNotTaken as exc:
            raise Skipped(f"{stack}: {exc}") from exc

    def each_stack(self) -> list[str]:
        return list(self.stacks)


def batch(built: Built, seed: int = 0) -> torch.Tensor:
    return built.example(torch.Generator().manual_seed(seed))


def loss_of(output: torch.Tensor) -> torch.Tensor:
    # A mean over the batch: a data-parallel step on halves of a batch then equals one step on the whole.
    return output.float().square().mean()


def sgd_step(built: Built, seed: int = 0, lr: float = 0.1) -> None:
    model = built.model
    model.train()
    model.zero_grad(set_to_none=True)
    loss_of(model(batch(built, seed))).backward()
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p.sub_(lr * p.grad)
    model.zero_grad(set_to_none=True)


def state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def differing(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> list[str]:
    if a.keys() != b.keys():
        return sorted(set(a) ^ set(b))
    return [k for k in a if a[k].shape != b[k].shape or not torch.equal(a[k], b[k])]


# --- the checks ------------------------------------------------------------------------------------------------------

def listing(s: Subject) -> None:
    """A docstring whose first line describes it, and options that build it by name alone, as `plugins NAME` shows."""
    cls = registry.load(s.kind, s.name)
    # The class's own docstring, not one inherited from its base: the listing reads it from the source.
    doc = inspect.cleandoc(cls.__doc__ or "")
    assert doc, f"{cls.__name__} has no docstring: its first line is the plugin's description in the listing"
    details = catalogue.details(s.kind, s.name)
    if details.options is not None:
        hints = typing.get_type_hints(cls.__init__)  # raises on an annotation that does not resolve
        for option in details.options:
            assert option.default != "(required)", (
                f"option {option.name!r} has no default: `{s.kind}: {s.name}` must build without options")
            assert option.name in hints, f"option {option.name!r} has no type annotation (the listing shows 'any')"
    registry.create(s.kind, s.name, dict(s.options))


def forward_backward(s: Subject) -> None:
    """Builds in every stack; the output and every parameter's gradient are finite, and every parameter has one."""
    for stack in s.each_stack():
        built = s.build(stack, seed=0)
        out = built.model(batch(built))
        assert torch.isfinite(out).all(), f"{stack}: non-finite output"
        loss_of(out).backward()
        for pname, p in built.model.named_parameters():
            if p.requires_grad:
                # A parameter the loss never reaches breaks DDP (unless told to look for unused ones) and never learns.
                assert p.grad is not None, f"{stack}: parameter {pname} gets no gradient"
                assert torch.isfinite(p.grad).all(), f"{stack}: non-finite gradient in {pname}"


def init_identity(s: Subject) -> None:
    """What the plugin declares it computes at init (``init_identities``) it computes, in every stack."""
    identities = init_identities(registry.load(s.kind, s.name))
    if not identities:
        raise Skipped("declares no init identity")
    for identity in identities:
        for stack in s.each_stack():
            check_identity(s, stack, identity)


def check_identity(s: Subject, stack: str, identity: InitIdentity) -> None:
    where = f"{stack}: {s.name} {identity.options or ''} as {identity.same_as} {identity.same_as_options or ''}"
    reference = s.build(stack, seed=0, name=identity.same_as, options=identity.same_as_options)
    candidate = s.build(stack, seed=1, options=identity.options)  # another seed: equal outputs are no coincidence
    theirs = candidate.model.state_dict()
    shared = {k: v for k, v in reference.model.state_dict().items() if k in theirs and theirs[k].shape == v.shape}
    unmatched = [k for k, v in reference.model.state_dict().items() if v.dim() >= 2 and k not in shared]
    assert not unmatched, f"{where}: the stacks do not share their weights by name ({', '.join(unmatched[:3])})"
    with torch.no_grad():
        for key, value in shared.items():
            if value.dim() == 1 and value.is_floating_point():  # gains and biases off their init, so they count
                value.normal_(1.0, 0.2, generator=torch.Generator().manual_seed(len(key)))
    reference.model.load_state_dict(shared, strict=False)
    candidate.model.load_state_dict(shared, strict=False)
    x = batch(reference)
    with torch.no_grad():
        want, got = reference.model(x), candidate.model(x)
    if identity.exact:
        assert torch.equal(got, want), f"{where}: not bitwise equal (max diff {(got - want).abs().max().item():.3g})"
    else:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=lambda m: f"{where}: {m}")


def reload(s: Subject) -> None:
    """After a training step, the state dict saved to bytes and loaded into a fresh model gives the same outputs."""
    for stack in s.each_stack():
        trained = s.build(stack, seed=0)
        sgd_step(trained)
        buffer = io.BytesIO()
        torch.save(trained.model.state_dict(), buffer)
        buffer.seek(0)
        fresh = s.build(stack, seed=1)
        fresh.model.load_state_dict(torch.load(buffer), strict=True)
        trained.model.eval(), fresh.model.eval()
        x = batch(trained, seed=1)
        with torch.no_grad():
            same = torch.equal(fresh.model(x), trained.model(x))
        assert same, f"{stack}: a reloaded model computes something else (state kept outside the state dict?)"


def determinism(s: Subject) -> None:
    """Under one seed, two builds have the same weights and take the same training step."""
    for stack in s.each_stack():
        a, b = s.build(stack, seed=0), s.build(stack, seed=0)
        assert not differing(state(a.model), state(b.model)), f"{stack}: two builds under one seed differ"
        sgd_step(a), sgd_step(b)
        diff = differing(state(a.model), state(b.model))
        assert not diff, f"{stack}: one training step under one seed differs in {', '.join(diff[:3])}"


def train_eval(s: Subject) -> None:
    """Eval mode is deterministic and changes no state; train mode may differ (batch statistics), eval twice may not."""
    for stack in s.each_stack():
        built = s.build(stack, seed=0)
        model, x = built.model, batch(built)
        sgd_step(built)  # statistics and weights away from their init
        model.eval()
        before = state(model)
        with torch.no_grad():
            first, second = model(x), model(x)
        assert torch.isfinite(first).all(), f"{stack}: non-finite output in eval mode"
        assert torch.equal(first, second), f"{stack}: two eval passes on one batch differ"
        changed = differing(before, state(model))
        assert not changed, f"{stack}: an eval pass changed {', '.join(changed[:3])}"


def carries_state(s: Subject, stack: str) -> bool:
    """Whether a training step changes something besides parameters (buffers, or state a progress hook keeps)."""
    built = s.build(stack, seed=0)
    if has_progress_hooks(built.model):
        return True
    params = {k for k, _ in built.model.named_parameters()}
    before = {k: v for k, v in state(built.model).items() if k not in params}
    sgd_step(built)
    after = {k: v for k, v in state(built.model).items() if k not in params}
    return bool(differing(before, after))


def distributed(s: Subject) -> None:
    """Where a training step changes state besides the parameters: 2 processes (gloo) agree with one on the whole
    batch. Parameters alone are DDP's job (their gradients are averaged), so a plugin without such state skips."""
    stack = s.each_stack()[0]
    if not carries_state(s, stack):
        raise Skipped("keeps no state outside its parameters (DDP's gradient average covers it)")
    from arch_plugins.testing.distributed import two_process_steps

    def build() -> Built:
        return s.build(stack, seed=0)

    single, ranks = two_process_steps(build, steps=STEPS)
    for key, expected in single.items():
        for rank, got in enumerate(ranks):
            torch.testing.assert_close(got[key], expected, atol=1e-5, rtol=1e-4,
                                       msg=lambda m, key=key, rank=rank: f"{stack}: rank {rank}'s {key} is not one "
                                                                         f"process's on the whole batch: {m}")


STEPS = 2
COMPILE_BACKEND = "aot_eager"


def on_meta(s: Subject) -> None:
    """The forward runs on the meta device (shapes, no storage), under CPU autocast as a bf16 run has it.

    arch-lab counts a model's FLOPs (``model/flops_per_token``, MFU) by a forward on a meta copy, and builds an FSDP2
    model on meta on every process but one. Plain tensor ops run there; what fails is asking about the device
    (``torch.is_autocast_enabled("meta")`` and ``torch.autocast("meta", ...)`` raise: ``arch_plugins.autocast``
    asks safely) or reading a value on the host (``.item()``, ``if tensor:``).
    """
    for stack in s.each_stack():
        built = s.build(stack, seed=0)
        shadow = copy.deepcopy(built.model, meta_memo(built.model))  # as lit.compute copies it
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            out = shadow(batch(built).to("meta"))
        assert out.device.type == "meta", f"{stack}: the output left the meta device ({out.device})"


def compiled(s: Subject) -> None:
    """``torch.compile`` (graph breaks allowed) computes what eager mode does, forward and backward.

    Traced by TorchDynamo and AOTAutograd, the parts a plugin's code decides (what traces, what breaks the graph,
    what functionalises), and run without Inductor's code generation: on CPU that alone takes about 40 s per
    plugin, against a few seconds for the rest.
    """
    stack = s.each_stack()[0]
    eager, traced = s.build(stack, seed=0), s.build(stack, seed=0)
    x = batch(eager)
    compiled_model = torch.compile(traced.model, backend=COMPILE_BACKEND)
    want, got = eager.model(x), compiled_model(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=lambda m: f"{stack}: compiled forward: {m}")
    loss_of(want).backward()
    loss_of(got).backward()
    grads = dict(eager.model.named_parameters())
    for pname, p in traced.model.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(p.grad, grads[pname].grad, rtol=1e-3, atol=1e-5,
                                       msg=lambda m, pname=pname: f"{stack}: compiled gradient of {pname}: {m}")


CHECKS: dict[str, Callable[[Subject], None]] = {
    "listing": listing,
    "forward_backward": forward_backward,
    "init_identity": init_identity,
    "reload": reload,
    "determinism": determinism,
    "train_eval": train_eval,
    "distributed": distributed,
    "meta": on_meta,
    "compile": compiled,
}
# Seconds per plugin rather than tenths: run them with `-m slow` or `--slow`.
SLOW_CHECKS = ("compile",)
FAST_CHECKS = tuple(c for c in CHECKS if c not in SLOW_CHECKS)
