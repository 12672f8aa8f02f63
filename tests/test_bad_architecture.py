"""Architectures whose parts do not fit together end in one ``error:`` line and exit code 2, in fit, validate and
the build check that a sweep runs on every variant before it spends compute (``lit.cli.check_config``)."""

from __future__ import annotations

import pytest

from lit.cli import check_config, main
from lit.errors import ArchitectureError
from lit.models.gpt import GPT
from lit.models.transformer import TransformerConfig
from tests.conftest import REPO

GPT_RECIPE = str(REPO / "recipes" / "gpt_baseline.yaml")  # d_model 128, 4 heads
VIT_RECIPE = str(REPO / "recipes" / "vit_digits.yaml")  # 8x8 digits, patch 2, d_model 64
QUIET = ["--trainer.logger=false", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]

CASES = [
    (GPT_RECIPE, ["--model.arch.n_heads=5"], "d_model=128 is not divisible by n_heads=5"),
    (GPT_RECIPE, ["--model.arch.d_model=36", "--model.arch.n_heads=4"], "RoPE needs an even head width"),
    (GPT_RECIPE, ["--model.arch.rope_pct=0.01"], "rope_pct=0.01 rotates 0 of the 32 dims"),
    (GPT_RECIPE, ["--model.arch.rope_pct=1.5"], "rope_pct is the fraction of each head"),
    (GPT_RECIPE, ["--model.arch.residual=laurel_lr", "--model.arch.residual_options={rank: 1000}"],
     "LAUREL rank 1000 exceeds d_model 128"),
    (GPT_RECIPE, ["--model.arch.projection=pattention", "--model.arch.bias=true"], "pattention has no bias"),
    (GPT_RECIPE, ["--model.arch.projection=pattention", "--model.arch.projection_options={tokens_ffn: -4}"],
     "tokens_ffn is a number of parameter tokens"),
    (GPT_RECIPE, ["--model.arch.norm=seednorm", "--model.arch.norm_options={heads: 3}"],
     "3 heads do not divide the width 128"),
    (VIT_RECIPE, ["--model.patch_size=3"], "image_size=8 is not a multiple of patch_size=3"),
    (VIT_RECIPE, ["--model.pos_embed=sincos", "--model.arch.d_model=30", "--model.arch.n_heads=2"],
     "sin-cos positions need d_model divisible by 4"),
    (VIT_RECIPE, ["--model.arch.positions=learned"], "a ViT's positions are set by pos_embed"),
]


def error_lines(capsys) -> list[str]:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return [line for line in err.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize("recipe, args, expected", CASES, ids=[" ".join(a) for _, a, _ in CASES])
def test_an_inconsistent_architecture_is_one_line_in_fit(recipe, args, expected, workdir, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", recipe, *args, *QUIET, "--trainer.fast_dev_run=true"])
    assert exit_info.value.code == 2
    errors = error_lines(capsys)
    assert len(errors) == 1 and expected in errors[0], errors


@pytest.mark.parametrize("how", ["validate", "sweep check"])
def test_validate_and_the_sweep_check_say_it_in_one_line_too(how, workdir, capsys):
    args = ["--config", GPT_RECIPE, "--model.arch.n_heads=5", *QUIET]
    with pytest.raises(SystemExit) as exit_info:
        main(["validate", *args]) if how == "validate" else check_config(args)
    assert exit_info.value.code == 2
    errors = error_lines(capsys)
    assert len(errors) == 1 and "choose n_heads among 1, 2, 4, 8, 16, 32, 64" in errors[0], errors


def test_built_directly_the_error_is_still_a_value_error():
    with pytest.raises(ValueError, match="not divisible") as e:
        GPT(65, 32, TransformerConfig(d_model=30, n_heads=4))
    assert isinstance(e.value, ArchitectureError)
