"""Data-parallel nGPT on 2 CPU processes (gloo) ends with the single-process weights: DDP and FSDP2.

Under FSDP2 (Lightning's ModelParallelStrategy, ``fully_shard`` per block) the parameters are DTensors
sharded on dim 0: the attention and MLP output projections are normalised along that sharded dim (a
reduction across ranks), the odd vocabulary shards the embedding and head unevenly, and a weight with
fewer rows than ranks leaves one rank an empty shard. Each run trains 3 optimizer steps with 2-batch
gradient accumulation on identical batches on every rank, so the gradient equals the single-process one.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from arch_plugins.constraints import renormalize_, unit_norm_parameters
from tests import distributed_worker as worker
from tests.conftest import REPO


@pytest.fixture(scope="module")
def single_process(tmp_path_factory):
    out = tmp_path_factory.mktemp("single") / "weights.pt"
    worker.main(["--strategy", "single", "--out", str(out)])
    return torch.load(out, weights_only=False)


def run_two_processes(strategy: str, tmp_path) -> dict:
    out = tmp_path / "weights.pt"
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "distributed_worker.py"), "--strategy", strategy,
                           "--out", str(out)], cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(out, weights_only=False)


# Adam divides by sqrt(v): a gradient differing in its last bit (FSDP2 pre/post-divides the reduce-scatter,
# and sums squares per shard) moves a few near-zero-gradient entries by up to ~1e-3 * lr after 3 steps.
# A wrong renormalisation of a sharded dim (per-shard norms) is off by O(0.1); DDP is bit-exact here.
TOLERANCE = {"fsdp2": 1e-4, "ddp": 1e-6}


@pytest.mark.parametrize("strategy", ["fsdp2", "ddp"])
def test_two_processes_end_with_the_single_process_weights(strategy, single_process, tmp_path):
    result = run_two_processes(strategy, tmp_path)
    assert result["world_size"] == 2
    assert result["global_step"] == single_process["global_step"] == worker.STEPS
    assert result["steps_renormalized"] == worker.STEPS  # once per optimizer step on each rank (rank 0 saved)
    if strategy == "fsdp2":  # really sharded: every parameter a DTensor on dim 0
        assert set(result["placements"].values()) == {"(Shard(dim=0),)"}
        check_small_weights(result["small"])

    initial = worker.build_model().model
    renormalize_(initial)
    initial = dict(initial.named_parameters())
    moved = max((single_process["state"][n] - p.detach()).abs().max().item() for n, p in initial.items())
    assert moved > 0.05  # the steps changed the weights far more than the tolerance
    for name, expected in single_process["state"].items():
        torch.testing.assert_close(result["state"][name], expected, atol=TOLERANCE[strategy], rtol=0, msg=name)

    model = worker.build_model().model  # the gathered weights are still on the sphere along the declared dims
    for name, _, dim in unit_norm_parameters(model):
        norms = result["state"][name].norm(dim=dim)
        torch.testing.assert_close(norms, torch.ones_like(norms), msg=name)


def check_small_weights(gathered: list[torch.Tensor]) -> None:
    """A (1, 5) weight normalised along its sharded dim 0 leaves rank 1 an empty shard, and DTensor
    returns the quotient sharded on dim 1: without redistributing it, ``copy_`` fails."""
    torch.manual_seed(2)
    layers = [torch.nn.Linear(i, o, bias=False) for (i, o), _ in worker.SMALL_SHAPES]
    layers.append(torch.nn.Conv2d(*worker.CONV, bias=False))  # 4-D: the norm over dim 0 keeps the other dims
    dims = [dim for _, dim in worker.SMALL_SHAPES] + [0]
    assert len(gathered) == len(layers)
    for got, layer, dim in zip(gathered, layers, dims, strict=True):
        w = layer.weight.detach()
        torch.testing.assert_close(got, w / w.norm(dim=dim, keepdim=True))
