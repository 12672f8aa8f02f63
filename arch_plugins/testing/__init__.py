"""The conformance kit: checks that a plugin of any kind behaves like the built-ins, for its authors and ours.

For every plugin, in every registered model stack (arch-lab's GPT and ViT, at a non-power-of-two size):

- ``listing``: a docstring, and options with types and defaults, as `cli.py plugins NAME` shows them;
- ``forward_backward``: finite outputs and gradients, a gradient for every parameter;
- ``init_identity``: what it declares it computes at init (``arch_plugins.init_identity``), exactly;
- ``reload``: a state dict saved and loaded into a fresh model gives the same outputs;
- ``determinism``: one seed, one model, one training step;
- ``train_eval``: eval mode deterministic and stateless;
- ``distributed``: with state besides its parameters, 2 gloo processes agree with one on the whole batch;
- ``meta``: the forward runs on the meta device (the FLOP count and FSDP2's build run it there);
- ``compile`` (slow): ``torch.compile`` computes what eager mode does.

From pytest, three lines in a test file::

    @pytest.mark.parametrize("case", conformance_cases("norm", "scalenorm"), ids=str)
    def test_conforms(case):
        case.run()

From a shell: ``python -m arch_plugins.testing norm scalenorm`` (``--all``, ``--slow``; exit 1 on a failure).
Pure PyTorch: the stacks are found through entry points (``arch_plugins.testing.stacks``), not imported.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from arch_plugins.testing.checks import CHECKS, FAST_CHECKS, SLOW_CHECKS, Skipped, Subject
from arch_plugins.testing.stacks import Size, StackBuilder, stacks

__all__ = ["CHECKS", "FAST_CHECKS", "SLOW_CHECKS", "Case", "Result", "Size", "Skipped", "check",
           "conformance_cases"]


@dataclass(frozen=True)
class Result:
    kind: str
    name: str
    check: str
    status: str  # "pass", "fail" or "skip"
    detail: str
    seconds: float


@dataclass
class Case:
    """One check of one plugin; ``run()`` raises on failure (and skips under pytest when it does not apply)."""

    kind: str
    name: str
    check: str
    options: Mapping[str, Any] = field(default_factory=dict)
    stacks: Mapping[str, StackBuilder] | None = None
    size: Size = field(default_factory=Size)

    def __str__(self) -> str:
        return f"{self.kind}-{self.name}-{self.check}"

    def subject(self) -> Subject:
        return Subject(self.kind, self.name, self.stacks if self.stacks is not None else stacks(), self.options,
                       self.size)

    def run(self) -> None:
        try:
            CHECKS[self.check](self.subject())
        except Skipped as exc:
            if "pytest" in sys.modules:
                import pytest

                pytest.skip(str(exc))
            raise

    def result(self) -> Result:
        start = time.perf_counter()
        try:
            CHECKS[self.check](self.subject())
            status, detail = "pass", ""
        except Skipped as exc:
            status, detail = "skip", str(exc)
        except Exception as exc:  # a plugin's own failure, whatever its type, is that plugin's failing check
            status, detail = "fail", f"{type(exc).__name__}: {exc}".splitlines()[0]
        return Result(self.kind, self.name, self.check, status, detail, time.perf_counter() - start)


def conformance_cases(kind: str, name: str, *, checks: Iterable[str] = FAST_CHECKS,
                      options: Mapping[str, Any] | None = None, stacks: Mapping[str, StackBuilder] | None = None,
                      size: Size | None = None) -> list[Case]:
    """The cases for plugin ``name`` of ``kind``, one per check (``checks=CHECKS`` adds the slow ones)."""
    unknown = [c for c in checks if c not in CHECKS]
    if unknown:
        raise ValueError(f"unknown checks {unknown}; the checks are: {', '.join(CHECKS)}")
    return [Case(kind, name, c, dict(options or {}), stacks, size or Size()) for c in checks]


def check(kind: str, name: str, **kw) -> list[Result]:
    """Run every case of ``conformance_cases(kind, name, **kw)`` and return their results (nothing raises)."""
    return [case.result() for case in conformance_cases(kind, name, **kw)]
