"""The FLOP count runs on fake tensors (lit/compute.py): for every registered norm, residual, projection and
parametrization it equals the count of a real forward, and it costs no arithmetic, so counting a large model at
start-up takes what a toy does."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from arch_plugins import registry
from lit.compute import CUSTOM_FLOPS, TRAINING_PASSES, gpt_flops_per_token
from lit.models import GPT, TransformerConfig

KINDS = ("norm", "residual", "projection", "parametrization")
# Components that need a partner to build (the rest take the defaults for everything else).
PARTNERS = {("residual", "ngpt"): {"norm": "hypersphere"}, ("norm", "hypersphere"): {"residual": "ngpt"}}
HEADS = {("norm", "3pt"): 3}  # 3PT aligns the heads with its 3 phases


def real_count(model: GPT, seq: int) -> float:
    model.eval()
    with torch.no_grad(), FlopCounterMode(display=False, custom_mapping=CUSTOM_FLOPS) as counter:
        model(torch.zeros(1, seq, dtype=torch.long))
    model.train()
    return TRAINING_PASSES * counter.get_total_flops() / seq


# By default the components whose forward does something unusual (a refresh at the first forward, a wider stream,
# per-token coefficients, parameter tokens, nGPT's pair); every registered one under -m slow.
DEFAULT = {("norm", "rmsnorm"), ("norm", "bhyt"), ("norm", "prepbn"), ("residual", "mhc"), ("residual", "ngpt"),
           ("residual", "laurel_rw_lr_pa"), ("projection", "pattention"), ("parametrization", "completep")}
EVERY = [pytest.param(kind, name, marks=() if (kind, name) in DEFAULT else pytest.mark.slow)
         for kind in KINDS for name in registry.names(kind)]


@pytest.mark.parametrize("kind, name", EVERY)
def test_the_count_on_fake_tensors_equals_a_real_forward(kind, name):
    arch = {kind: name, **PARTNERS.get((kind, name), {})}
    # d_model 48: 3PT's phases, LAUREL's rank.
    model = GPT(29, 12, TransformerConfig(d_model=48, n_layers=2, n_heads=HEADS.get((kind, name), 2), **arch))
    assert gpt_flops_per_token(model) == real_count(model, 12)


def test_counting_computes_nothing_and_changes_nothing():
    """The forward that counts sees meta tensors (shapes, no storage), and what it does to its modules stays with
    them: BHyT's refresh at the first forward (a real matrix product, and a flag) is still due after counting."""
    model = GPT(29, 12, TransformerConfig(d_model=16, n_layers=2, n_heads=2, norm="bhyt"))
    inputs = []
    model.head.register_forward_pre_hook(lambda module, args: inputs.append(args[0].device.type))
    due = [m for m in model.modules() if hasattr(m, "stale")]
    assert due and all(m.stale and m.refreshes == 0 for m in due)
    assert gpt_flops_per_token(model) > 0
    assert inputs == ["meta"]
    assert all(m.stale and m.refreshes == 0 for m in due)
