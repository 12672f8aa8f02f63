"""Per-example test results as a run artifact, so that a comparison can resample test examples as well as seeds.

Every run of a sweep is scored on the same test split: a verdict over seeds generalises over seeds, not over test
examples. With each example's result stored (text: the mean loss of each window; images: each image's loss and
whether it was classified correctly), ``cli.py compare`` can put an interval over seeds x examples beside the
seed-only one (``lit/compare/examples.py``).

The artifact is ``test_examples.npz``: one array per quantity, in the test set's own order (the test loader does
not shuffle). Under DDP each process scores every world-size-th example (``DistributedSampler``, no shuffle, the
last ones repeated to even the ranks out); the gathered arrays are interleaved back into that order and trimmed.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import torch

ARTIFACT = "test_examples.npz"


def gathered(module, batches: list[dict[str, torch.Tensor]], total: int | None) -> dict[str, np.ndarray]:
    """Each quantity over the whole test set, in its order, from every process (call it on every rank)."""
    if not batches:
        return {}
    out = {}
    for key in batches[0]:
        local = torch.cat([b[key] for b in batches]).to(module.device)
        if module.trainer.world_size > 1:
            local = module.all_gather(local)  # [world, n]: rank r holds examples r, r + world, ...
            local = local.transpose(0, 1).reshape(-1)
        values = local.double().cpu().numpy()
        out[key] = values[:total] if total is not None else values
    return out


def log(module, arrays: dict[str, np.ndarray]) -> None:
    """Write the arrays as ``ARTIFACT`` into every logger that stores run artifacts (MLflow's); rank 0 only."""
    if not arrays or module.global_rank != 0:
        return
    for logger in module.loggers:
        client, run_id = getattr(logger, "experiment", None), getattr(logger, "run_id", None)
        if run_id is None or not hasattr(client, "log_artifact"):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / ARTIFACT
            np.savez_compressed(path, **arrays)
            client.log_artifact(run_id, str(path))


def read(path: str | Path) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {k: data[k] for k in data.files}
