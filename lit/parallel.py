"""How the transformer blocks run at scale, applied from outside the model in one place (torchtitan's rule).

Model code stays single-device. ``ArchitectureTask.configure_model`` (lit/task.py) applies, per
``Block`` and in torchtitan's order:

1. activation checkpointing (``checkpoint_blocks``): a block's activations are recomputed in backward;
2. ``torch.compile`` (``compile_model``): the whole model as one graph, or each block on its own under FSDP2;
3. FSDP2 (``shard``), when the strategy provides a device mesh of more than one process (``wraps``; torchtitan
   applies ``fully_shard`` only when ``dp_shard > 1``: on one device the wrapper costs its hooks and copies and
   shards nothing, 0.65x a plain model on an H200): each block becomes one ``fully_shard``
   unit (its parameters are all-gathered for its forward and backward, then freed; the last block's stay
   gathered between its forward and backward), the embedding another, and the readout (final norm site, head,
   logits site) another, kept gathered after forward; the root unit holds the rest (positions, the embedding
   site, a stream's begin and end; a tied embedding and head). Parameters become DTensors sharded on dim 0;
   weight constraints declared on modules survive (they are plain attributes), so the unit-norm
   renormalisation works on the shards.

None of them renames a parameter, so checkpoints move freely between runs with and without them.
``FSDP2Strategy`` is Lightning's ``ModelParallelStrategy`` set up for what ``shard`` does: every
process in one data-parallel group.
"""

from __future__ import annotations

import warnings
from datetime import timedelta

import torch
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.pytorch.strategies import ModelParallelStrategy
from lightning.pytorch.utilities import rank_zero_info
from torch import nn
from torch.utils.checkpoint import checkpoint

from arch_plugins.interfaces import ResidualHistory
from lit.errors import UserInputError
from lit.models.transformer import Block

DATA_PARALLEL, TENSOR_PARALLEL = "data_parallel", "tensor_parallel"


def blocks(model: nn.Module) -> list[Block]:
    return [m for m in model.modules() if isinstance(m, Block)]


def checkpoint_blocks(model: nn.Module) -> None:
    """Recompute each block's activations in backward instead of keeping them; idempotent."""
    for block in blocks(model):
        if "forward" not in vars(block):  # the instance attribute marks a block already wrapped
            block.forward = _recomputed(block.forward)


def _recomputed(forward):
    def run(h: torch.Tensor, history: ResidualHistory, rope, cache=None) -> torch.Tensor:
        if not torch.is_grad_enabled() or cache is not None:  # nothing to recompute; a KV cache means decoding
            return forward(h, history, rope, cache)
        if not history.recording:  # nothing looks back: the block's input is all a recomputation needs
            return checkpoint(forward, h, history, rope, use_reentrant=False)
        # A block appends to the shared history and residuals may read it (LAUREL-PA looks back). Recomputing
        # on the live history would read entries of later blocks, so the block runs (and reruns) on a copy of
        # the history as it was when the block started, and its new entries are handed back.
        before = (list(history.states), list(history.branches), list(history.block_inputs))

        def block_on_copy(h: torch.Tensor):
            local = ResidualHistory(*(list(entries) for entries in before))
            out = forward(h, local, rope)
            return out, *(entries[len(old):] for entries, old in
                           zip((local.states, local.branches, local.block_inputs), before, strict=True))

        out, states, branches, block_inputs = checkpoint(block_on_copy, h, use_reentrant=False)
        history.states += states
        history.branches += branches
        history.block_inputs += block_inputs
        return out

    return run


def compile_model(model: nn.Module, *, per_block: bool = False, mode: str | None = None, **options) -> None:
    """``torch.compile`` the model in place (parameter names unchanged); idempotent. ``options`` go to
    ``torch.compile`` (a test passes ``backend``).

    ``mode="reduce-overhead"`` (whole model only): the training forward (gradients on, ``model.training``) is
    compiled with CUDA graphs, its backward with it; every other call (validation, test, prediction, a probe) runs
    the default-mode graph, outside the CUDA graphs, so an evaluation batch of another shape records no graph and
    overwrites no training output. Each training forward first marks a new step for the graphs
    (``torch.compiler.cudagraph_mark_step_begin``): the previous step's outputs, read by then, may be overwritten.

    Whole (the default): the model is one graph, traced with ``fullgraph=True`` (nanoGPT's and modded-nanogpt's
    way). The residual history is made and used up inside that one forward, so its entries are no Python state
    that dynamo guards: one graph for training and one for evaluation, whatever the depth
    (``tests/test_compile_graphs.py``, over every registered plugin). Should a component break the graph
    anyway, the model still compiles, with breaks, and a warning names the break once.

    ``per_block``: each block compiled on its own, for FSDP2 (torchtitan's choice): dynamo does not trace
    FSDP2's hooks, which sit at every block's edges, so a whole-model graph would break there. Blocks whose
    Python state is the same share one graph; a residual whose merges differ by depth (LAUREL-PA's count of
    earlier streams, AttnRes's sources) gets one graph per depth, so the recompile limit allows one per block.
    """
    if per_block:
        model_blocks = blocks(model)
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, len(model_blocks) + 8)
        for block in model_blocks:
            if getattr(block, "_compiled_call_impl", None) is None:
                block.compile(**options)
        return
    if getattr(model, "_compiled_call_impl", None) is not None:
        return
    model.compile(fullgraph=True, **options)
    compiled = {"one graph": model._compiled_call_impl}
    if mode == "reduce-overhead":
        compiled["step"] = torch.compile(model._call_impl, fullgraph=True, mode=mode, **options)

    def call(*args, **kwargs):
        if "with breaks" in compiled:
            return compiled["with breaks"](*args, **kwargs)
        graph = "one graph"
        if "step" in compiled and model.training and torch.is_grad_enabled():
            graph = "step"
            torch.compiler.cudagraph_mark_step_begin()
        try:
            return compiled[graph](*args, **kwargs)
        # Raised while tracing, before any of the graph ran: a graph break, or a data-dependent guard (Python
        # control flow on a tensor's value), which one graph cannot hold.
        except (torch._dynamo.exc.Unsupported, torch._dynamo.exc.UserError) as exc:
            warnings.warn(f"torch.compile: the model does not compile as one graph, so it runs as several "
                          f"(slower): {str(exc).splitlines()[0]}", stacklevel=2)
            compiled["with breaks"] = torch.compile(model._call_impl, **options)
            return compiled["with breaks"](*args, **kwargs)

    model._compiled_call_impl = call


def is_sharded(model: nn.Module) -> bool:
    """Whether ``shard`` has already been applied to ``model`` (FSDP2 made it an ``FSDPModule``)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def _data_parallel_mesh(device_mesh):
    names = device_mesh.mesh_dim_names or ()
    if TENSOR_PARALLEL in names and device_mesh[TENSOR_PARALLEL].size() > 1:
        raise UserInputError("tensor parallelism is not implemented; use ModelParallelStrategy with "
                             "tensor_parallel_size=1 (FSDP2 data parallelism) or lit.parallel.FSDP2Strategy")
    return device_mesh[DATA_PARALLEL] if DATA_PARALLEL in names else device_mesh


def wraps(device_mesh, *, wrap_one_device: bool = False) -> bool:
    """Whether ``shard`` applies FSDP2 on ``device_mesh``: only over more than one process (torchtitan's
    ``dp_shard > 1``), unless ``wrap_one_device`` asks for the wrapper alone (a test of FSDP2's units, a measure of
    its fixed cost). On one process the model runs as a plain single-device model, with that run's numbers."""
    return _data_parallel_mesh(device_mesh).size() > 1 or wrap_one_device


def shard(model: nn.Module, device_mesh, precision: str | None = None, *, wrap_one_device: bool = False) -> nn.Module:
    """Apply FSDP2 ``fully_shard`` to every transformer block, then to ``model``; idempotent. On a one-process
    mesh nothing is applied (``wraps``) and one log line says so.

    With ``bf16-mixed`` the blocks compute and all-gather in bf16 while the sharded fp32 parameters stay
    the master weights (what the optimizer and weight constraints act on) and gradients reduce in fp32.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if is_sharded(model):  # configure_model may run again (e.g. a second fit)
        return model
    mesh = _data_parallel_mesh(device_mesh)
    if not wraps(device_mesh, wrap_one_device=wrap_one_device):
        rank_zero_info("FSDP2: one process, so the model is not wrapped (nothing to shard); it trains as on one device")
        return model
    policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if precision == "bf16-mixed" else MixedPrecisionPolicy())
    model_blocks = blocks(model)
    for index, block in enumerate(model_blocks):
        # Backward starts with the last block: freeing its weights after forward only to gather them again at
        # once would cost an all-gather for nothing (torchtitan keeps it gathered too).
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=index < len(model_blocks) - 1)
    for modules, reshard_after_forward in edge_units(model):
        fully_shard(modules, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    model.register_forward_hook(_reshard_after_inference)
    return model


def _reshard_after_inference(model: nn.Module, args, output) -> None:
    """After a forward without gradients (validation, a probe), give every unit back its shards.

    Units that stay gathered after forward (the root, the last block, the readout) wait for a backward that a
    no-grad forward never has. Left gathered, the next training step computed wrong gradients for exactly those
    parameters (measured on 2 gloo processes: the head's off by more than its own size), and a checkpoint or an
    optimizer step in between would see full tensors.
    """
    if torch.is_grad_enabled():
        return
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def edge_units(model: nn.Module) -> list[tuple[list[nn.Module], bool]]:
    """The FSDP2 units besides the blocks, as (modules, reshard after forward): the embedding, and the readout
    (final norm site, head, logits site) as one unit kept gathered after forward, since backward begins there.

    Units of their own let the embedding's and the head's all-gather and reduce-scatter overlap with the blocks'
    compute; in the root (the rest: positions, the embedding site, a stream's begin and end) they could not, and
    at a vocabulary of 50k they are half the parameters. A head tied to the embedding is one parameter used at
    both ends: it stays in the root with the embedding.
    """
    head, stack = getattr(model, "head", None), getattr(model, "stack", None)
    embedding = next((getattr(model, name) for name in ("tok", "patch") if isinstance(getattr(model, name, None),
                                                                                      nn.Module)), None)
    if head is None or stack is None or embedding is None:
        return []
    if any(p is q for p in head.parameters() for q in embedding.parameters()):  # tied
        return []
    readout = [m for m in (getattr(stack, "final", None), head, getattr(model, "logits", None)) if m is not None]
    return [([embedding], True), (readout, False)]


class FSDP2Strategy(ModelParallelStrategy):
    """FSDP2 data parallelism over every process of every node (``ModelParallelStrategy`` with no tensor parallelism).

    ``ModelParallelStrategy``'s "auto" sizes give tensor parallelism within a node, which ``shard`` does not do.

    Args:
        save_distributed_checkpoint: each rank writes its shard (a checkpoint directory, fast, reshardable to
            another number of processes); False gathers full weights into one file on rank 0.
        process_group_backend: ``nccl`` on GPUs, ``gloo`` on CPUs by default.
        timeout: collective timeout.
        build_on_meta: rank 0 alone builds the model; the other processes build it on the meta device and take
            their shards of rank 0's weights after sharding (lit/sharded_build.py; bit-identical, one whole copy
            instead of one per process). Read by ``cli.py`` before the model is built.
        wrap_one_device: wrap the model in FSDP2 on a single process too (``wraps``): only to measure the
            wrapper's own cost or test its units; by default one process trains the plain model.
    """

    def __init__(self, save_distributed_checkpoint: bool = True, process_group_backend: str | None = None,
                 timeout: timedelta | None = default_pg_timeout, build_on_meta: bool = True,
                 wrap_one_device: bool = False):
        super().__init__(data_parallel_size="auto", tensor_parallel_size=1,
                         save_distributed_checkpoint=save_distributed_checkpoint,
                         process_group_backend=process_group_backend, timeout=timeout)
        self.build_on_meta, self.wrap_one_device = build_on_meta, wrap_one_device

    def setup_environment(self) -> None:
        self._data_parallel_size = self.num_nodes * self.num_processes
        super().setup_environment()

    def save_checkpoint(self, checkpoint, filepath, storage_options=None) -> None:
        # Shards go to a hidden folder renamed into place once whole (lit/checkpoint_writing.py); a full file goes
        # through the strategy's checkpoint writer, which does the same for one file.
        if self._save_distributed_checkpoint and storage_options is None:
            from lit.checkpoint_writing import save_sharded_whole

            return save_sharded_whole(self, checkpoint, filepath)
        return super().save_checkpoint(checkpoint, filepath, storage_options)
