"""Every recipe under recipes/ trains: a fast_dev_run of each, exactly as a user would launch it.

ImageNet recipes get a tiny ImageNet-layout folder of real JPEGs as ``--data.root``, and a small
width (a ViT-B/16 step takes minutes on 2 CPU cores, and bf16 on a CPU without bf16 units far longer);
the unchanged command runs in the slow test below. Token-shard recipes (FineWeb) get synthetic llm.c-format
shards with a full-size validation shard, and a small width and batch. The tinyshakespeare recipes run their one
step at batch 4: their batch of 12-64 sequences adds compute (1-4 s a recipe on 2 cores), not code; the
architecture, optimizer, schedule, sequence length and data are the recipe's.
"""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from lit.cli import main
from lit.data.shards import write_shard
from tests.conftest import REPO, TINY_VIT

RECIPES = sorted((REPO / "recipes").glob("*.yaml"))


def _needs_image_folder(recipe) -> bool:
    return yaml.safe_load(recipe.read_text())["data"]["class_path"].endswith("ImageFolderDataModule")


def _data_args(recipe) -> dict:
    return yaml.safe_load(recipe.read_text())["data"].get("init_args") or {}


def write_token_shards(directory, vocab_size: int, val_tokens: int, seed: int = 0) -> None:
    """llm.c-format shards named as modded-nanogpt's FineWeb ones: two small train shards and a val shard one
    window longer than the recipe's validation set, so the recipe's ``val_tokens`` fits as it is."""
    rng = np.random.default_rng(seed)
    directory.mkdir()
    for i in (1, 2):
        write_shard(directory / f"fineweb_train_{i:06d}.bin", rng.integers(0, vocab_size, 8192))
    write_shard(directory / "fineweb_val_000000.bin", rng.integers(0, vocab_size, val_tokens + 4096))


def tiny_timm_vit(path):
    """A fine-tuning recipe's published weights, made here: timm's DeiT-S/16 at TINY_VIT's width and depth, saved
    as DeiT releases it (``{"model": state_dict}``), with ImageNet's 1,000-class head."""
    import timm
    import torch

    vit = timm.create_model("deit_small_patch16_224", pretrained=False, embed_dim=32, depth=2, num_heads=2)
    torch.save({"model": vit.state_dict()}, path)
    return path


def test_there_are_recipes():
    names = {r.name for r in RECIPES}
    assert {"gpt_baseline.yaml", "vit_tokenformer.yaml", "vit_baseline.yaml", "gpt_tokenformer.yaml",
            "gpt_tokenformer_grow.yaml", "vit_tokenformer_digits.yaml", "gpt_ngpt.yaml", "vit_ngpt.yaml",
            "vit_ngpt_pattention.yaml", "vit_dyt.yaml", "vit_seednorm.yaml"} <= names


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_recipe_fast_dev_run(recipe, workdir_with_store, image_folder):
    workdir = workdir_with_store
    args = ["fit", "--config", str(recipe), "--trainer.fast_dev_run=true", "--trainer.enable_progress_bar=false"]
    if _needs_image_folder(recipe):
        args += [f"--data.root={image_folder}", "--data.num_workers=0", "--model.variant=null", *TINY_VIT]
    if (yaml.safe_load(recipe.read_text())["model"].get("init_args") or {}).get("init_from"):
        args.append(f"--model.init_from={tiny_timm_vit(workdir / 'vit.pth')}")
    data_class = yaml.safe_load(recipe.read_text())["data"]["class_path"]
    if data_class.endswith("TextDataModule") and "shards_dir" not in _data_args(recipe):
        args.append("--data.batch_size=4")
    if "shards_dir" in _data_args(recipe):
        data = _data_args(recipe)
        write_token_shards(workdir / "shards", data["vocab_size"], data.get("val_tokens") or 0)
        args += [f"--data.shards_dir={workdir / 'shards'}", "--data.num_workers=0", "--data.batch_size=1",
                 "--trainer.accumulate_grad_batches=1", "--model.arch.d_model=64", "--model.arch.n_layers=2",
                 "--model.arch.n_heads=2", "--trainer.precision=32-true"]  # bf16 here: 16 s, not 9
    main(args)
    assert (workdir / "mlflow.db").is_file()


def test_fineweb_recipe_validates_on_the_first_10485760_val_tokens(tmp_path):
    """modded-nanogpt's validation set: the first 10,485,760 tokens of the val shard, each scored once."""
    from lit.data.text import TextDataModule

    recipe = REPO / "recipes" / "gpt_fineweb_track3.yaml"
    data = _data_args(recipe)
    write_token_shards(tmp_path / "shards", data["vocab_size"], data["val_tokens"])
    dm = TextDataModule(shards_dir=str(tmp_path / "shards"), vocab_size=data["vocab_size"],
                        block_size=data["block_size"], val_tokens=data["val_tokens"])
    dm.setup("fit")
    assert data["val_tokens"] == 10_485_760 and len(dm.val_set) * data["block_size"] == 10_485_760
    shard = np.fromfile(tmp_path / "shards" / "fineweb_val_000000.bin", dtype=np.uint16, offset=256 * 4)
    x, y = dm.val_set[len(dm.val_set) - 1]  # the last window ends at token 10,485,760, its last target
    assert y[-1].item() == shard[10_485_760] and x[0].item() == shard[10_485_760 - 1024]
    full = TextDataModule(shards_dir=str(tmp_path / "shards"), vocab_size=data["vocab_size"], block_size=1024)
    full.setup("fit")
    assert len(full.val_set) > len(dm.val_set)


def test_val_tokens_must_fit_and_be_whole_windows(tmp_path):
    from lit.data.text import TextDataModule
    from lit.errors import UserInputError

    with pytest.raises(UserInputError, match="multiple of --data.block_size"):
        TextDataModule(block_size=64, val_tokens=100)
    dm = TextDataModule(block_size=64, val_tokens=64 * 10**6)
    with pytest.raises(UserInputError, match="holds only"):
        dm.setup("fit")
    dm = TextDataModule(block_size=64, val_tokens=640)
    dm.setup("fit")
    assert len(dm.val_set) == 10


@pytest.mark.slow
def test_imagenet_recipe_unchanged_on_an_image_folder(workdir, image_folder):
    main(["fit", "--config", str(REPO / "recipes/vit_tokenformer.yaml"), "--trainer.fast_dev_run=true",
          f"--data.root={image_folder}"])
