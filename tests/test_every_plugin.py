"""Every registered plugin of every kind passes the conformance kit (arch_plugins.testing): registering a plugin is
what gets it tested. The kinds and names are read from the registry, so a new kind or plugin needs no edit here.

The slow checks (torch.compile) run under `-m slow`."""

from __future__ import annotations

import pytest

from arch_plugins import registry
from arch_plugins.testing import FAST_CHECKS, SLOW_CHECKS, conformance_cases
from lit.models import conformance

EVERY = [(kind, name) for kind in registry.kinds() for name in registry.names(kind)]
# The builders themselves rather than their entry points: a checkout whose installed metadata predates them still
# runs these (tests/test_conformance_kit.py checks the entry points).
STACKS = {"gpt": conformance.gpt, "vit": conformance.vit}


def cases(checks):
    return [case for kind, name in EVERY for case in conformance_cases(kind, name, checks=checks, stacks=STACKS)]


@pytest.mark.parametrize("case", cases(FAST_CHECKS), ids=str)
def test_conforms(case):
    case.run()


@pytest.mark.slow
@pytest.mark.parametrize("case", cases(SLOW_CHECKS), ids=str)
def test_conforms_slowly(case):
    case.run()


def test_every_kind_has_plugins_to_check():
    # An empty parametrization would pass silently: each kind the registry knows has its names here.
    assert {kind for kind, _ in EVERY} == set(registry.kinds())
