"""Every recipe under recipes/ trains: a fast_dev_run of each, exactly as a user would launch it.

ImageNet recipes get a tiny ImageNet-layout folder of real JPEGs as ``--data.root``, and a small
width (a ViT-B/16 step takes minutes on 2 CPU cores, and bf16 on a CPU without bf16 units far longer);
the unchanged command runs in the slow test below.
"""

from __future__ import annotations

import pytest
import yaml

from lit.cli import main
from tests.conftest import REPO, TINY_VIT

RECIPES = sorted((REPO / "recipes").glob("*.yaml"))


def _needs_image_folder(recipe) -> bool:
    return yaml.safe_load(recipe.read_text())["data"]["class_path"].endswith("ImageFolderDataModule")


def test_there_are_recipes():
    names = {r.name for r in RECIPES}
    assert {"gpt_baseline.yaml", "vit_tokenformer.yaml", "vit_baseline.yaml", "gpt_tokenformer.yaml",
            "gpt_tokenformer_grow.yaml", "vit_tokenformer_digits.yaml", "gpt_ngpt.yaml", "vit_ngpt.yaml",
            "vit_ngpt_pattention.yaml", "vit_dyt.yaml", "vit_seednorm.yaml"} <= names


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_recipe_fast_dev_run(recipe, workdir, image_folder):
    args = ["fit", "--config", str(recipe), "--trainer.fast_dev_run=true", "--trainer.enable_progress_bar=false"]
    if _needs_image_folder(recipe):
        args += [f"--data.root={image_folder}", "--data.num_workers=0", "--model.variant=null", *TINY_VIT]
    main(args)
    assert (workdir / "mlflow.db").is_file()


@pytest.mark.slow
def test_imagenet_recipe_unchanged_on_an_image_folder(workdir, image_folder):
    main(["fit", "--config", str(REPO / "recipes/vit_tokenformer.yaml"), "--trainer.fast_dev_run=true",
          f"--data.root={image_folder}"])
