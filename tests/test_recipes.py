"""Every recipe under recipes/ trains: a fast_dev_run of each, exactly as a user would launch it."""

from __future__ import annotations

import pytest

from lit.cli import main
from tests.conftest import REPO

RECIPES = sorted((REPO / "recipes").glob("*.yaml"))


def test_there_are_recipes():
    assert any(r.name == "gpt_baseline.yaml" for r in RECIPES)


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_recipe_fast_dev_run(recipe, workdir):
    main(["fit", "--config", str(recipe), "--trainer.fast_dev_run=true", "--trainer.enable_progress_bar=false"])
    assert (workdir / "mlflow.db").is_file()
