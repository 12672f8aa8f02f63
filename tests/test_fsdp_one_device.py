"""FSDP2 on one process wraps nothing (lit/parallel.py ``wraps``, torchtitan's ``dp_shard > 1``): the run is the plain
single-device run, number for number, and one log line says why. ``wrap_one_device`` still wraps, for a test of
FSDP2's units or a measure of the wrapper's own cost (tests/fsdp_units_worker.py opts in)."""

from __future__ import annotations

import logging

import torch
from torch.distributed.fsdp import FSDPModule

from lit.cli import main
from tests.conftest import REPO

BASELINE = str(REPO / "recipes" / "gpt_baseline.yaml")
TINY = ["--model.arch.d_model=32", "--model.arch.n_layers=2", "--model.arch.n_heads=2", "--data.block_size=32",
        "--data.batch_size=4", "--trainer.max_steps=3", "--trainer.limit_val_batches=1",
        "--trainer.val_check_interval=3", "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false", "--trainer.num_sanity_val_steps=0", "--trainer.accelerator=cpu",
        "--trainer.devices=1"]
FSDP2 = ["--config", str(REPO / "recipes" / "trainer" / "fsdp.yaml")]


def test_one_process_under_fsdp2_trains_the_plain_model_to_the_same_numbers(workdir_with_store, caplog):
    plain = main(["fit", "--config", BASELINE, *TINY])
    expected = {k: v.clone() for k, v in plain.model.state_dict().items()}
    with caplog.at_level(logging.INFO):
        one = main(["fit", "--config", BASELINE, *FSDP2, *TINY])
    assert not any(isinstance(m, FSDPModule) for m in one.model.modules())
    assert sum("FSDP2: one process, so the model is not wrapped" in r.getMessage() for r in caplog.records) == 1
    assert one.trainer.global_step == plain.trainer.global_step == 3
    for name, tensor in one.model.state_dict().items():
        assert torch.equal(tensor, expected[name]), name  # bit for bit: the loss after each step too
