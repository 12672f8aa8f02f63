"""Per-example test results as a run artifact (lit/tracking/per_example.py): each window's or image's result, in
the test set's order, agreeing with the aggregate the run logs."""

from __future__ import annotations

import tempfile
from pathlib import Path
from types import SimpleNamespace

import mlflow
import numpy as np
import pytest
import torch

from lit.cli import main
from lit.tracking import per_example
from tests.conftest import REPO, TINY_LM, TINY_VIT

SHORT = ["--trainer.max_steps=3", "--trainer.val_check_interval=3", "--trainer.limit_val_batches=1"]


def artifact_of(run_id: str) -> dict[str, np.ndarray]:
    client = mlflow.MlflowClient(f"sqlite:///{Path.cwd() / 'mlflow.db'}")  # absolute: MLflow caches by URI
    with tempfile.TemporaryDirectory() as tmp:
        return per_example.read(client.download_artifacts(run_id, per_example.ARTIFACT, tmp))


def fit_then_test(args: list[str]):
    cli = main(["fit", *args])
    cli.trainer.test(cli.model, datamodule=cli.datamodule, verbose=False)
    return cli, cli.trainer.callback_metrics, cli.trainer.logger.run_id


def test_text_runs_store_each_test_window_s_loss(workdir):
    cli, metrics, run_id = fit_then_test(["--config", str(REPO / "recipes/gpt_baseline.yaml"), *TINY_LM, *SHORT,
                                   "--trainer.limit_test_batches=3"])
    arrays = artifact_of(run_id)
    windows = 3 * cli.datamodule.batch_size  # three full test batches
    assert set(arrays) == {"loss"} and arrays["loss"].shape == (windows,)
    # Equal windows: the mean of the window means is the logged test loss (a mean over every token).
    assert arrays["loss"].mean() == pytest.approx(float(metrics["test/loss"]), rel=1e-5)


def test_image_runs_store_each_test_image_s_loss_and_correctness(workdir):
    cli, metrics, run_id = fit_then_test(["--config", str(REPO / "recipes/vit_digits.yaml"), *TINY_VIT,
                                   "--trainer.max_steps=3", "--trainer.limit_val_batches=1"])
    arrays = artifact_of(run_id)
    images = len(cli.datamodule.test_dataloader().dataset)
    assert arrays["acc1"].shape == arrays["loss"].shape == (images,)  # the whole split, in its order
    assert set(np.unique(arrays["acc1"])) <= {0.0, 1.0}
    assert arrays["acc1"].mean() == pytest.approx(float(metrics["test/acc1"]), abs=1e-6)
    assert arrays["loss"].mean() == pytest.approx(float(metrics["test/loss"]), rel=1e-4)


def test_ddp_ranks_are_interleaved_back_into_the_test_set_s_order():
    # DistributedSampler without shuffle: rank r scores examples r, r + 2, ...; the last one repeated to even out.
    examples = torch.arange(7.0)
    ranks = [torch.cat([examples[r::2], examples[-1:]])[:4] for r in range(2)]
    module = SimpleNamespace(device="cpu", trainer=SimpleNamespace(world_size=2),
                             all_gather=lambda t: torch.stack(ranks))
    out = per_example.gathered(module, [{"loss": ranks[0][:2]}, {"loss": ranks[0][2:]}], total=7)
    assert out["loss"].tolist() == examples.tolist()
