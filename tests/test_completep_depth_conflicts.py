"""CompleteP refuses, in one line, the pieces its branch multiplier does not depth-scale (review D3, issue 30 item 3):
LAUREL's low-rank and previous-activation terms, nGPT's -alpha*h term on a norm that is not the hypersphere, and
Pattention's own 1/L value init. The refusal follows what the residual or projection declares
(``depth_scaling_conflict``), never a plugin's name; everything the branch multiplier does reach still builds."""

from __future__ import annotations

import pytest
import torch

from arch_plugins import registry
from arch_plugins.interfaces import StackInfo
from arch_plugins.residuals.add import AddResidual
from lit.errors import ArchitectureError
from lit.models.gpt import GPT
from lit.models.transformer import TransformerConfig
from tests.conftest import REPO, assert_refused_in_one_line


def gpt(parametrization: str = "completep", layers: int = 4, **arch) -> GPT:
    options = arch.pop("parametrization_options", {"base_depth": 2})
    return GPT(65, 16, TransformerConfig(d_model=32, n_layers=layers, n_heads=2, parametrization=parametrization,
                                         parametrization_options=options, **arch))


CONFLICTS = [
    ({"residual": "laurel_lr"}, "LAUREL's low-rank terms B A x"),
    ({"residual": "laurel_pa"}, "LAUREL's previous-activation terms"),
    ({"residual": "laurel_rw_lr"}, "LAUREL's low-rank terms B A x"),
    ({"residual": "laurel_rw_lr_pa"}, "low-rank terms B A x and previous-activation terms"),
    ({"residual": "laurel_lr", "residual_options": {"placement": "sublayer"}}, "LAUREL's low-rank terms"),
    ({"residual": "ngpt"}, "nGPT's -alpha*h term"),  # on rmsnorm: the hypersphere is refused before, as under mup
    ({"residual": "ngpt", "norm": "dyt"}, "nGPT's -alpha*h term"),
    ({"projection": "pattention"}, "Pattention's value-token init 2/(n_layers*sqrt(d_model))"),
]


@pytest.mark.parametrize("arch, expected", CONFLICTS)
@pytest.mark.parametrize("layers", [2, 8])  # the base depth (m_L = 1, every multiplier 1) is refused as well
def test_completep_refuses_what_its_branch_multiplier_does_not_scale(arch, expected, layers):
    with pytest.raises(ArchitectureError) as info:
        gpt(layers=layers, **arch)
    message = str(info.value)
    assert expected in message and "L^-alpha" in message and "parametrization mup" in message, message
    assert "\n" not in message


def test_each_refusal_names_what_to_use_instead():
    remedies = {"laurel_lr": "use residual laurel_rw or add", "ngpt": "use residual add"}
    for residual, remedy in remedies.items():
        with pytest.raises(ArchitectureError, match=remedy):
            gpt(residual=residual)
    with pytest.raises(ArchitectureError, match="set projection_options.value_std"):
        gpt(projection="pattention")


@pytest.mark.parametrize("arch", [
    {"residual": "laurel_rw"},  # alpha multiplies the branch as the block hands it over: already depth-scaled
    {"residual": "laurel_rw", "residual_options": {"placement": "sublayer"}},
    {"projection": "pattention", "projection_options": {"value_std": 0.02}},  # an init that does not follow depth
    {"residual": "add"},
])
def test_what_the_branch_multiplier_reaches_still_builds_and_trains(arch):
    model = gpt(**arch)
    logits = model(torch.zeros(1, 8, dtype=torch.long))
    logits.float().mean().backward()
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("parametrization, options", [
    ("mup", {}),  # no depth rule: nothing to conflict with
    ("completep", {"base_depth": 2, "without": ["branch_multiplier"]}),
    ("completep", {"base_depth": 2, "alpha": 0.0}),
    ("sp", {}),
])
def test_without_a_branch_multiplier_the_same_pieces_build(parametrization, options):
    for arch in ({"residual": "laurel_rw_lr_pa"}, {"residual": "ngpt"}, {"projection": "pattention"}):
        gpt(parametrization, parametrization_options=options, **arch)


class _Shrinking(AddResidual):
    """A residual of no built-in name that declares a term the branch multiplier does not reach."""

    def depth_scaling_conflict(self, stack: StackInfo) -> str | None:
        return "a test residual's own carry term: use residual add"


def test_the_refusal_follows_the_declaration_not_the_name():
    registry.register("residual", "completep_test_shrinking", _Shrinking)
    try:
        with pytest.raises(ArchitectureError, match="no depth rule for a test residual's own carry term"):
            gpt(residual="completep_test_shrinking")
        gpt("mup", parametrization_options={}, residual="completep_test_shrinking")
    finally:
        registry.unregister("residual", "completep_test_shrinking")


def test_the_command_line_refusal_is_one_error_line(workdir, capsys):
    assert_refused_in_one_line(workdir, capsys, [
        "fit", "--config", str(REPO / "recipes" / "gpt_laurel_lr.yaml"), "--model.arch.parametrization=completep",
        "--model.arch.parametrization_options={base_depth: 2}", "--trainer.fast_dev_run=true",
        "--trainer.logger=false"], "has no depth rule for LAUREL's low-rank terms B A x")
