"""Every registered norm, residual and projection runs its forward on the meta device.

The FLOP count behind ``model/flops_per_token`` and MFU runs the model's forward on meta tensors first
(``lit.compute._forward_flops``) and falls back to FakeTensorMode only where an operator has no meta kernel. A plugin
whose forward raises on meta for another reason takes the fallback silently, and under FSDP2 the fallback itself
failed (LAUREL-PA asked autocast about the "meta" device, 2026-12-02: ``arch_plugins.autocast``). So each plugin's
forward is run here on meta directly, under CPU autocast as a bf16 run has it.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from arch_plugins import registry
from arch_plugins.testing.stacks import Size
from lit.models import conformance

KINDS = ("norm", "residual", "projection")
# Plugins whose forward has an operator without a meta kernel, each with its cause, as a strict xfail (so a fix
# shows); the FLOP count takes FakeTensorMode for them. None today: full and block AttnRes, hyper-connections and
# mHC ran on meta once they stopped asking torch.autocast about the meta device (arch_plugins.autocast).
NO_META_KERNEL: dict[tuple[str, str], str] = {}
EVERY = [(kind, name) for kind in KINDS for name in registry.names(kind)]


def on_meta(model: nn.Module) -> nn.Module:
    memo = {}
    for t in (*model.parameters(), *model.buffers()):
        meta = torch.empty_like(t, device="meta")
        memo[id(t)] = nn.Parameter(meta, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else meta
    return copy.deepcopy(model, memo)


@pytest.mark.parametrize(("kind", "name"), [
    pytest.param(*v, marks=pytest.mark.xfail(strict=True, reason=NO_META_KERNEL[v])) if v in NO_META_KERNEL else v
    for v in EVERY], ids=lambda v: v)
def test_the_forward_runs_on_the_meta_device(kind, name):
    needed = getattr(registry.load(kind, name), "stack_options", {}).get("gpt", {})
    torch.manual_seed(0)
    built = conformance.gpt({kind: (name, needed)}, Size(d_model=48, n_heads=3, n_layers=2))
    x = built.example(torch.Generator().manual_seed(0))[:2].to("meta")  # 2 sequences
    shadow = on_meta(built.model)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = shadow(x)
    assert out.device.type == "meta"
