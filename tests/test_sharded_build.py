"""lit/sharded_build.py in one process: who builds on the meta device, and what the CLI's configuration asks for.
The two-process run (rank 1 on meta, bit-identical to building everywhere) is in tests/test_sharded_checkpoints.py."""

from __future__ import annotations

import warnings

import pytest
import torch
from jsonargparse import Namespace

from lit import sharded_build
from lit.language_model import LanguageModel
from lit.models import TransformerConfig
from tests.test_growth import _save

RANK_VARIABLES = ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID")


@pytest.fixture
def launcher_env(monkeypatch):
    for name in RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(sharded_build, "_requested", False)
    return monkeypatch


@pytest.mark.parametrize("variables, zero", [
    ({}, True),  # Lightning's launcher: its own process, rank 0, has none
    ({"RANK": "0", "LOCAL_RANK": "0"}, True),  # torchrun's rank 0
    ({"LOCAL_RANK": "1"}, False),  # a process Lightning's launcher started
    ({"RANK": "3", "LOCAL_RANK": "1"}, False),
    ({"NODE_RANK": "1"}, False),  # local rank 0 of the second node
    ({"SLURM_PROCID": "2"}, False),
])
def test_rank_zero_is_read_from_the_launchers_environment(launcher_env, variables, zero):
    for name, value in variables.items():
        launcher_env.setenv(name, value)
    assert sharded_build.global_rank_is_zero() is zero
    assert not sharded_build.builds_on_meta()  # not asked for
    sharded_build.request()
    assert sharded_build.builds_on_meta() is (not zero)


def test_only_fsdp2_strategy_with_build_on_meta_left_on_asks():
    fsdp2 = "lit.parallel.FSDP2Strategy"
    assert sharded_build.asked_by_strategy(Namespace(class_path=fsdp2, init_args=Namespace(build_on_meta=True)))
    assert sharded_build.asked_by_strategy(Namespace(class_path=fsdp2, init_args=Namespace()))
    assert not sharded_build.asked_by_strategy(Namespace(class_path=fsdp2, init_args=Namespace(build_on_meta=False)))
    strategy = "lightning.pytorch.strategies.ModelParallelStrategy"
    assert not sharded_build.asked_by_strategy(Namespace(class_path=strategy, init_args=Namespace()))
    assert not sharded_build.asked_by_strategy("ddp")
    assert not sharded_build.asked_by_strategy(None)


def test_another_rank_builds_on_meta_and_leaves_init_from_to_rank_0(launcher_env, tmp_path):
    arch = TransformerConfig(d_model=16, n_layers=1, n_heads=2)
    torch.manual_seed(0)
    checkpoint = _save(LanguageModel(vocab_size=11, block_size=8, arch=arch), tmp_path / "start.ckpt")
    sharded_build.request()
    launcher_env.setenv("LOCAL_RANK", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "copying into a meta parameter is a no-op" per weight
        model = LanguageModel(vocab_size=11, block_size=8, arch=arch, init_from=checkpoint)
    assert model.built_on_meta and all(p.is_meta for p in model.parameters())
    launcher_env.setenv("LOCAL_RANK", "0")
    model = LanguageModel(vocab_size=11, block_size=8, arch=arch, init_from=checkpoint)
    assert not model.built_on_meta and not any(p.is_meta for p in model.parameters())
