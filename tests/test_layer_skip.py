"""``cli.py layer-skip``: one row per block and per sublayer on a tiny trained GPT and ViT, the full model's row is
the checkpoint's own validation loss (accuracy), skipping a block whose branches are zero changes nothing, skipping
a block of the plain residual is the block returning its input, and bad input is one error line."""

from __future__ import annotations

import pytest
import torch

from lit.commands import main
from lit.language_model import LanguageModel
from lit.models import TransformerConfig
from lit.procedures.checkpoint_io import load_trained_task
from lit.procedures.layer_skip import datamodule_for, default_batches, first, measure, read_recipe, skipping
from tests.conftest import REPO

BASELINE = str(REPO / "recipes" / "gpt_baseline.yaml")
VIT = str(REPO / "recipes" / "vit_digits.yaml")
QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false", "--trainer.logger=false",
         "--model.diagnostics.interval=0"]
TINY_GPT = ["--model.arch.d_model=16", "--model.arch.n_layers=2", "--model.arch.n_heads=2", "--data.block_size=16",
            "--data.batch_size=2", "--trainer.limit_val_batches=3", *QUIET]
TINY_VIT = ["--model.arch.d_model=16", "--model.arch.n_layers=2", "--model.arch.n_heads=2",
            "--data.batch_size=32", "--trainer.limit_val_batches=2", *QUIET]
GPT_RECIPE = """
data:
  class_path: lit.data.TextDataModule
  init_args: {block_size: 16, batch_size: 2}
trainer:
  limit_val_batches: 3
"""
VIT_RECIPE = """
data:
  class_path: lit.data.DigitsDataModule
  init_args: {batch_size: 32}
trainer:
  limit_val_batches: 2
"""


@pytest.fixture(scope="module")
def gpt(tmp_path_factory) -> tuple[str, str]:
    """A tiny GPT after 3 steps, its checkpoint and a recipe with its data."""
    tmp = tmp_path_factory.mktemp("gpt")
    main(["fit", "--config", BASELINE, *TINY_GPT, "--trainer.max_steps=3", "--trainer.val_check_interval=3",
          f"--checkpoint.dirpath={tmp}"])
    (tmp / "recipe.yaml").write_text(GPT_RECIPE)
    return str(tmp / "last.ckpt"), str(tmp / "recipe.yaml")


def full_row(ckpt: str, recipe: str):
    """The ``none`` row measured in process, unrounded."""
    module, hparams = load_trained_task(ckpt, "layer-skip")
    recipe_text = read_recipe(recipe)
    data = datamodule_for(hparams, recipe_text)
    data.setup("validate")
    return measure(module, first(data.val_dataloader(), default_batches(recipe_text)))[0]


def rows_of(output: str) -> dict[str, list[float]]:
    """The printed table: label -> its numbers."""
    rows = {}
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and cells[0] != "skipped":
            rows[cells[0]] = [float(c) for c in cells[1:]]
    return rows


def test_gpt_table_has_a_row_per_block_and_sublayer_and_the_full_row_is_the_checkpoints_loss(gpt, tmp_path, capsys,
                                                                                               monkeypatch):
    ckpt, recipe = gpt
    monkeypatch.chdir(tmp_path)
    main(["layer-skip", ckpt, "--config", recipe, "--out", str(tmp_path / "skip.png")])
    rows = rows_of(capsys.readouterr().out)
    assert list(rows) == ["none", "block 0", "block 1", "attn 0", "attn 1", "mlp 0", "mlp 1"]
    assert (tmp_path / "skip.png").stat().st_size > 0
    validated = main(["validate", "--config", BASELINE, *TINY_GPT, f"--ckpt_path={ckpt}"])
    loss = validated.trainer.callback_metrics["val/loss"].item()
    assert rows["none"][0] == pytest.approx(loss, abs=5e-5)  # printed to 4 decimals
    assert rows["none"][1:] == [0.0, 0.0]
    assert full_row(ckpt, recipe).loss == pytest.approx(loss, rel=1e-6)  # the same batches, summed in another order
    for label, (skipped_loss, delta, kl) in rows.items():
        if label != "none":
            assert kl > 0 and delta == pytest.approx(skipped_loss - rows["none"][0], abs=2e-4), label


def test_vit_table_reports_accuracy_and_the_full_row_is_the_checkpoints(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    main(["fit", "--config", VIT, *TINY_VIT, "--trainer.max_steps=3", "--trainer.max_epochs=1",
          f"--checkpoint.dirpath={tmp_path}"])
    (tmp_path / "recipe.yaml").write_text(VIT_RECIPE)
    main(["layer-skip", str(tmp_path / "last.ckpt"), "--config", str(tmp_path / "recipe.yaml")])
    out = capsys.readouterr().out
    assert "top-1 acc" in out
    rows = rows_of(out)
    assert len(rows) == 1 + 3 * 2
    validated = main(["validate", "--config", VIT, *TINY_VIT, f"--ckpt_path={tmp_path / 'last.ckpt'}"])
    metrics = validated.trainer.callback_metrics
    full = full_row(str(tmp_path / "last.ckpt"), str(tmp_path / "recipe.yaml"))
    assert full.loss == pytest.approx(metrics["val/loss"].item(), rel=1e-6)
    assert full.accuracy == pytest.approx(metrics["val/acc1"].item(), abs=1e-6)
    assert rows["none"][3] == pytest.approx(full.accuracy, abs=5e-5)


def tiny_lm(residual: str = "add", norm: str = "rmsnorm") -> LanguageModel:
    torch.manual_seed(0)
    arch = TransformerConfig(d_model=16, n_layers=3, n_heads=2, norm=norm, residual=residual, init_std=0.2)
    return LanguageModel(vocab_size=11, block_size=8, arch=arch).eval()


def batches(n: int = 2):
    g = torch.Generator().manual_seed(0)
    return [(torch.randint(0, 11, (2, 8), generator=g), torch.randint(0, 11, (2, 8), generator=g)) for _ in range(n)]


@pytest.mark.parametrize("residual", ["add", "hyperconn", "laurel_pa"])
def test_skipping_a_block_whose_branches_are_zero_changes_nothing(residual):
    module = tiny_lm(residual)
    with torch.no_grad():
        block = module.model.stack.blocks[1]
        for linear in (block.attn.out, block.mlp.down):
            linear.weight.zero_()
    rows = {r.skip.label: r for r in measure(module, batches())}
    for label in ("block 1", "attn 1", "mlp 1"):
        assert rows[label].loss == rows["none"].loss and rows[label].kl == 0, label
    assert rows["block 0"].kl > 0 and rows["attn 2"].kl > 0


def test_skipping_a_plain_pre_norm_block_is_the_block_returning_its_input():
    module = tiny_lm()
    idx = batches(1)[0][0]
    stack = module.model.stack
    with torch.no_grad():
        handle = stack.blocks[1].register_forward_hook(lambda block, args, output: args[0])
        identity = module(idx)
        handle.remove()
        with skipping(stack, ((1, "attn"), (1, "mlp"))):
            skipped = module(idx)
        assert torch.equal(skipped, identity)
        full = module(idx)
        with skipping(stack, ()):
            assert torch.equal(module(idx), full)  # skipping nothing is the model itself
        assert not torch.equal(skipped, full)


@pytest.mark.parametrize("residual, norm", [("ngpt", "hypersphere"), ("attnres", "rmsnorm")])
def test_residuals_that_fuse_or_look_back_are_skipped_through_their_merge_and_given_back(residual, norm):
    module = tiny_lm(residual, norm)
    stack, idx = module.model.stack, batches(1)[0][0]
    fused = [(b.attn_fused, b.mlp_fused) for b in stack.blocks]
    with torch.no_grad():
        full = module(idx)
        rows = measure(module, batches())
        assert torch.equal(module(idx), full)  # hooks removed, fusion given back
    assert [(b.attn_fused, b.mlp_fused) for b in stack.blocks] == fused
    assert all(r.kl > 0 for r in rows[1:]) and all(torch.isfinite(torch.tensor(r.loss)) for r in rows)


def test_bad_input_is_one_error_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(["layer-skip", str(tmp_path / "missing.ckpt")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: layer-skip: checkpoint not found")
