"""FSDP2 units (lit/parallel.py) on 2 CPU processes (gloo): the layout, and the chunked training loss through them.

Run by tests/test_fsdp_units.py as ``python tests/fsdp_units_worker.py OUT.json WORLD``: WORLD processes (1 runs
in this one, more are spawned), and rank 0 writes what it saw. Each rank shards a GPT, reads out the loss in chunks
(lit/readout_loss.py: the head is called once per chunk, outside the model's forward, as FSDP2's grouped units
allow) and compares every gradient with an unsharded copy's whole-logits loss, over three steps with an
evaluation forward (no gradients, the whole readout) after each.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere, as pytest's subprocess does

from arch_plugins.stabilisers.z_loss import z_loss  # noqa: E402
from lit.models import GPT, TransformerConfig  # noqa: E402
from lit.parallel import shard  # noqa: E402
from lit.readout_loss import readout_loss  # noqa: E402

VOCAB, T = 23, 8  # odd vocabulary: the head shards unevenly


def build(tied: bool) -> GPT:
    torch.manual_seed(0)
    return GPT(VOCAB, T, TransformerConfig(d_model=16, n_layers=3, n_heads=2, logit_softcap=4.0), tie_embeddings=tied)


def units(model: torch.nn.Module) -> dict[str, dict]:
    """Each FSDP2 unit: its modules (by name), whether it frees its weights after forward, the parameters it holds."""
    from torch.distributed.fsdp import FSDPModule

    names = {module: name or "(root)" for name, module in model.named_modules()}
    seen, layout = set(), {}
    for module in model.modules():
        if not isinstance(module, FSDPModule):
            continue
        state = module._get_fsdp_state()
        if id(state) in seen:
            continue
        seen.add(id(state))
        group = state._fsdp_param_group
        key = ",".join(names[m] for m in state._modules)
        layout[key] = {"reshard_after_forward": group is not None and group.post_forward_mesh_info is not None,
                       "parameters": sorted(f"{names[p._module_info.module]}.{p._module_info.param_name}"
                                            for p in (group.fsdp_params if group else []))}
    return layout


def run(rank: int, world: int, init: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    report = {}
    for tied in (False, True):
        # One process opts in to the wrapper (lit/parallel.py ``wraps``): its units are what this checks.
        reference, sharded = build(tied), shard(build(tied), mesh, wrap_one_device=True)
        report[f"tied={tied}"] = {"units": units(sharded), "max_grad_error": 0.0, "max_loss_error": 0.0}
        g = torch.Generator().manual_seed(1)  # the same batch on every rank: the averaged gradient is the batch's
        for _ in range(3):
            idx, targets = torch.randint(0, VOCAB, (4, T), generator=g), torch.randint(0, VOCAB, (4, T), generator=g)
            reference.zero_grad()
            logits = reference(idx)
            expected = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten()) + 0.1 * z_loss(logits)
            expected.backward()
            sharded.zero_grad()
            ce, z = readout_loss(sharded.readout, sharded(idx, readout=False), targets, chunk=5, with_z=True)
            (ce + 0.1 * z).backward()
            errors = [(p.grad.full_tensor() - q.grad).abs().max().item()
                      for p, q in zip(sharded.parameters(), reference.parameters(), strict=True)]
            entry = report[f"tied={tied}"]
            entry["max_grad_error"] = max(entry["max_grad_error"], *errors)
            entry["max_loss_error"] = max(entry["max_loss_error"], abs((ce + 0.1 * z).item() - expected.item()))
            with torch.no_grad():  # validation between steps: the whole readout inside the forward
                entry["eval_error"] = (sharded(idx) - reference(idx)).abs().max().item()
    if rank == 0:
        Path(out).write_text(json.dumps(report, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    out, world = sys.argv[1], int(sys.argv[2])
    init = f"file://{os.path.abspath(out)}.rendezvous"
    if world == 1:
        run(0, 1, init, out)
    else:
        mp.spawn(run, args=(world, init, out), nprocs=world, join=True)
