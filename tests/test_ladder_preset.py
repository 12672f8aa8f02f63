"""The scaling ladder preset (benchmarks/ladder.py): the muP baseline's rate, tuned at the base shape, is the
recipe's, the ladder transfers and checks it for every variant, and each variant changes one component."""

import pytest
import yaml

from benchmarks import ladder
from lit.errors import UserInputError


def test_the_ladder_transfers_the_recipes_rate_and_checks_it_for_every_variant():
    command = ladder.sweep_command(list(ladder.VARIANTS), seeds=3, parallel=2)
    assert command[command.index("--ladder_lr") + 1] == "transfer"
    assert command[command.index("--ladder_lr_check") + 1] == "all"
    assert command[command.index("--config") + 1] == ladder.RECIPE
    assert len(command[command.index("--ladder") + 1].split(";")) >= 4  # at least 4 rungs
    variants = [command[i + 1] for i, a in enumerate(command) if a == "--variant"]
    assert variants == list(ladder.VARIANTS.values())
    # one component each: the keys a variant sets all belong to one of the norm or the residual
    for overrides in variants:
        components = {key.split("=")[0].split(".")[2].removesuffix("_options") for key in overrides.split(",")}
        assert components <= {"norm", "residual", "depth_scaled_init"} and len(components - {"depth_scaled_init"}) == 1
        assert "lr" not in overrides  # the baseline's rate, transferred


def test_the_recipe_is_at_its_base_shape():
    with open(ladder.RECIPE) as f:
        arch = yaml.safe_load(f)["model"]["init_args"]["arch"]
    assert arch["parametrization"] == "mup"
    assert arch["d_model"] == arch["parametrization_options"]["base_width"]  # what --ladder_lr transfer requires
    first_rung = dict(kv.split("=") for kv in ladder.RUNGS.split(";")[0].split(","))
    assert int(first_rung["d_model"]) == arch["d_model"]


def test_the_base_rate_is_the_lowest_mean_over_the_tuning_seeds(monkeypatch, tmp_path):
    monkeypatch.setattr(ladder, "OUT", str(tmp_path))
    # 0.016 wins on one seed; 0.011 has the lower mean
    monkeypatch.setattr(ladder, "base_losses", lambda: {0.011: [2.70, 2.66, 2.64], 0.016: [2.60, 2.74, 2.75]})
    assert ladder.tuned_lr() == 0.011
    page = (tmp_path / "base_lr.md").read_text()
    assert "| 0.011 | 2.6667 |" in page and "**picked**" in page


def test_a_recipe_rate_other_than_the_tuned_one_is_refused(monkeypatch, tmp_path):
    monkeypatch.setattr(ladder, "OUT", str(tmp_path))
    monkeypatch.setattr(ladder, "base_losses", lambda: {0.008: [2.9], 0.011: [2.6]})
    monkeypatch.setattr(ladder, "recipe_lr", lambda: 0.008)
    with pytest.raises(UserInputError, match="set its model.init_args.lr to 0.011"):
        ladder.check_recipe_lr()
    monkeypatch.setattr(ladder, "recipe_lr", lambda: 0.011)
    ladder.check_recipe_lr()
