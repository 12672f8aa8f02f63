"""Compute accounting: FLOPs counted on the built model equal the hand count for the baseline, plugins that add
matrix work add FLOPs, counting has no side effect, and a fit logs the facts and a cumulative ``train/flops``."""

from __future__ import annotations

import mlflow
import pytest
import torch

from lit.cli import main
from lit.compute import gpt_flops_per_token, hand_count_gpt, non_embedding_parameters, vit_flops_per_image
from lit.image_classifier import ImageClassifier
from lit.models.gpt import GPT
from lit.models.transformer import TransformerConfig
from lit.models.vit import ViT
from tests.conftest import REPO, TINY_LM


@pytest.mark.parametrize("mlp", ["swiglu", "gelu", "relu2"])
@pytest.mark.parametrize("d_model, n_layers, n_heads, seq", [(128, 2, 4, 64), (48, 3, 3, 40)])
def test_counted_flops_equal_the_hand_count_for_the_baseline(mlp, d_model, n_layers, n_heads, seq):
    arch = TransformerConfig(d_model=d_model, n_layers=n_layers, n_heads=n_heads, mlp=mlp)
    model = GPT(65, seq, arch)
    assert gpt_flops_per_token(model) == hand_count_gpt(arch, 65, seq)


def test_attention_flops_grow_with_context_and_plugins_add_their_matrices():
    arch = TransformerConfig(d_model=64, n_layers=2, n_heads=4)
    short, long = gpt_flops_per_token(GPT(65, 32, arch)), gpt_flops_per_token(GPT(65, 64, arch))
    # 12 L d T per token: doubling T adds 12 * 2 * 64 * 32 FLOPs per token.
    assert long - short == 12 * 2 * 64 * 32
    laurel = TransformerConfig(d_model=64, n_layers=2, n_heads=4, residual="laurel_lr")
    assert gpt_flops_per_token(GPT(65, 32, laurel)) > short


def test_counting_leaves_batch_statistics_and_random_state_alone():
    model = GPT(65, 16, TransformerConfig(d_model=32, n_layers=1, n_heads=2, norm="prepbn"))
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    gpt_flops_per_token(model)
    assert model.training and torch.equal(rng, torch.get_rng_state())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_vit_flops_count_the_patch_embedding_the_stack_and_the_head():
    arch = TransformerConfig(d_model=32, n_layers=1, n_heads=2, mlp="gelu", positions="none")
    model = ViT(10, 8, 2, 1, arch)
    tokens, d, h = 16 + 1, 32, 128
    patch = 2 * (2 * 2 * 1) * d * 16  # a (d, 1, 2, 2) convolution over 16 patches
    stack = 2 * tokens * (4 * d * d + 2 * d * h) + 4 * tokens * tokens * d
    head = 2 * d * 10
    assert vit_flops_per_image(model, 8, 1) == 3 * (patch + stack + head)


def test_non_embedding_parameters_leave_out_lookup_tables_but_keep_a_tied_head():
    arch = TransformerConfig(d_model=32, n_layers=1, n_heads=2, positions="learned")
    untied, tied = GPT(65, 16, arch), GPT(65, 16, arch, tie_embeddings=True)
    total = sum(p.numel() for p in untied.parameters())
    assert non_embedding_parameters(untied) == total - 65 * 32 - 16 * 32
    assert non_embedding_parameters(tied) == sum(p.numel() for p in tied.parameters()) - 16 * 32


def test_a_fit_logs_flops_per_item_and_cumulative_flops(workdir_with_store):
    workdir = workdir_with_store
    main(["fit", "--config", str(REPO / "recipes" / "gpt_baseline.yaml"), *TINY_LM, "--trainer.max_steps=3",
          "--trainer.limit_val_batches=1", "--trainer.val_check_interval=3", "--trainer.log_every_n_steps=1"])
    client = mlflow.MlflowClient(f"sqlite:///{workdir}/mlflow.db")
    run = client.search_runs([e.experiment_id for e in client.search_experiments()])[0]
    per_token = run.data.metrics["model/flops_per_token"]
    per_step = run.data.metrics["train/items_per_step"]
    assert run.data.metrics["model/non_embedding_parameters"] < run.data.metrics["model/parameters"]
    history = client.get_metric_history(run.info.run_id, "train/flops")
    assert [m.value for m in sorted(history, key=lambda m: m.step)] == pytest.approx(
        [per_token * per_step * k for k in (1, 2, 3)], rel=1e-6)


def test_the_image_task_counts_per_image_and_names_its_metric():
    task = ImageClassifier(num_classes=10, image_size=8, in_chans=1, patch_size=2,
                           arch=TransformerConfig(d_model=32, n_layers=1, n_heads=2, mlp="gelu", positions="none"))
    assert task.flops_metric == "model/flops_per_image"
    assert task.training_flops_per_item() == vit_flops_per_image(task.model, 8, 1)
