"""Parallelism applied from outside the model, in one place (torchtitan's rule): FSDP2 per transformer block.

Model code stays single-device. ``ArchitectureTask.configure_model`` (lit/task.py) calls ``shard`` when the strategy
(Lightning's ``ModelParallelStrategy``) provides a device mesh. Each ``Block`` becomes one FSDP unit
(its parameters are all-gathered for its forward and backward, then freed); the root unit holds the
rest (embeddings, head, model-level sites). Parameters become DTensors sharded on dim 0; weight
constraints declared on modules survive (they are plain attributes, and ``getattr`` returns the sharded
parameter), so the unit-norm renormalisation works on the shards.
"""

from __future__ import annotations

from torch import nn

from lit.errors import UserInputError
from lit.models.transformer import Block

DATA_PARALLEL, TENSOR_PARALLEL = "data_parallel", "tensor_parallel"


def shard(model: nn.Module, device_mesh) -> nn.Module:
    """Apply FSDP2 ``fully_shard`` to every transformer block, then to ``model``; idempotent."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    if isinstance(model, FSDPModule):  # configure_model may run again (e.g. a second fit)
        return model
    names = device_mesh.mesh_dim_names or ()
    if TENSOR_PARALLEL in names and device_mesh[TENSOR_PARALLEL].size() > 1:
        raise UserInputError("tensor parallelism is not implemented; use ModelParallelStrategy with "
                             "tensor_parallel_size=1 (FSDP2 data parallelism)")
    mesh = device_mesh[DATA_PARALLEL] if DATA_PARALLEL in names else device_mesh
    blocks = [m for m in model.modules() if isinstance(m, Block)]
    for block in blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model
