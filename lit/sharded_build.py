"""Building a model that FSDP2 will shard without a whole copy in every process.

Rank 0 builds the model as it always does; every other process builds it on the meta device (shapes and no
memory, no init); once ``fully_shard`` has split it, each process takes its shards of rank 0's weights by broadcast
(``set_model_state_dict(..., broadcast_from_rank0=True)``), and every buffer and rank 0's random-number state
follow. So N processes hold one whole copy between them at build time, not N, and build N - 1 times faster.

Why rank 0's weights rather than each process initialising its own shards (torchtitan's ``init_weights`` on a meta
model): here init happens in some forty components' constructors, and init by name draws each parameter from a
stream of its own; a second init path per plugin (a ``reset_parameters`` contract) would have to reproduce both bit
for bit. One build is the init; the others copy it, and a run is bit-identical to one that built everywhere
(tests/test_sharded_build.py).

The CLI asks for it when the trainer's strategy is ``lit.parallel.FSDP2Strategy`` (its ``build_on_meta``, on by
default); a script that builds the model itself calls ``request()`` before building it.
"""

from __future__ import annotations

import os

import torch
from torch import nn

_requested = False


def request(on: bool = True) -> None:
    """Build sharded models this way in this process (every process of a run must ask alike)."""
    global _requested
    _requested = on


def requested() -> bool:
    return _requested


def global_rank_is_zero() -> bool:
    """Whether this process can be global rank 0, read from the launcher's environment before any process group
    exists. torchrun sets RANK, Lightning's launcher LOCAL_RANK and NODE_RANK in the processes it starts (its own
    is rank 0), SLURM SLURM_PROCID: any of them above 0 means another rank."""
    return all(int(os.environ.get(name, "0") or 0) == 0 for name in ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID"))


def asked_by_strategy(strategy) -> bool:
    """Whether a trainer's ``strategy`` setting (a class_path and init_args, as the CLI parsed it) asks for this:
    ``lit.parallel.FSDP2Strategy`` with ``build_on_meta`` left on."""
    get = (lambda node, key: node.get(key)) if hasattr(strategy, "get") else (lambda node, key: None)
    if strategy is None or get(strategy, "class_path") != "lit.parallel.FSDP2Strategy":
        return False
    init_args = get(strategy, "init_args") or {}
    return bool(init_args.get("build_on_meta", True))


def builds_on_meta() -> bool:
    """Whether this process builds its model on the meta device (asked for, and not global rank 0)."""
    return _requested and not global_rank_is_zero()


def whole_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """What rank 0 hands out: its whole state before sharding (other ranks: nothing)."""
    return model.state_dict() if not builds_on_meta() else {}


def materialize(model: nn.Module, device: torch.device, whole: dict[str, torch.Tensor]) -> None:
    """After ``fully_shard``: give every process its shards of rank 0's ``whole`` state, rank 0's buffers and rank
    0's random-number state. Every process of the run calls it (collectives)."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    on_meta = any(t.is_meta for t in (*model.parameters(), *model.buffers()))
    if on_meta:
        model.to_empty(device=device)
    else:
        model.to(device)
    set_model_state_dict(model, whole, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    # Buffers are replicated, not sharded; those outside the state dict (RoPE's tables) are rank 0's too.
    for buffer in model.buffers():
        dist.broadcast(buffer.data, src=0)
    # Every process drew the same numbers building its model before; a meta build draws none, so the generator
    # would be left where it was. Rank 0's state puts it where a whole build leaves it.
    state = torch.get_rng_state().to(device)
    dist.broadcast(state, src=0)
    torch.set_rng_state(state.cpu())
