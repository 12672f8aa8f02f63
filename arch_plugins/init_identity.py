"""A plugin's statement of what it computes at initialisation: "with these options, exactly what plugin Y does".

Many components are built to start as a known one and move away as they learn (LAUREL starts as the plain
residual, one-stream hyper-connections are the plain residual, SeeDNorm starts as RMSNorm). Such a promise is
worth checking on every stack it can be built into, and worth keeping true when the code changes. A plugin
class states it as a class attribute; the conformance kit (``arch_plugins.testing``) checks it::

    class LaurelLR(ResidualType):
        init_identities = (InitIdentity("add"),)

The check builds the two stacks with different seeds, copies every weight of ``same_as``'s stack into the
plugin's (matched by name and shape; every matrix must find its twin, so the two share all their random
weights), moves the copied gains and biases off their init so they count, and compares the outputs: bitwise
when ``exact``, within float rounding otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class InitIdentity:
    """At init, this plugin with ``options`` computes what plugin ``same_as`` of the same kind does with
    ``same_as_options``, given the same weights."""

    same_as: str
    options: dict[str, Any] = field(default_factory=dict)
    same_as_options: dict[str, Any] = field(default_factory=dict)
    # False: equal up to float rounding (the same sum taken in another order).
    exact: bool = True
    why: str = ""


def init_identities(plugin: type | object) -> tuple[InitIdentity, ...]:
    """What ``plugin`` (a class or an instance) declares; () when it declares nothing."""
    return tuple(getattr(plugin, "init_identities", ()))
