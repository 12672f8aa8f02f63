"""The trainer overlays (recipes/trainer/*.yaml) compose with the recipes, and every kind of model trains under each.

Single-process overlays run in this process; DDP and FSDP2 run the CLI in 2 gloo processes on CPU (Lightning
re-executes the script once per extra process). The models cover the plugin kinds: LAUREL (history-reading
residual), nGPT (unit-norm weights renormalised on DTensor shards), Pattention (TokenFormer), and a ViT.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from arch_plugins.constraints import unit_norm_parameters
from lit.checkpoints import export, is_sharded
from lit.cli import main
from lit.language_model import LanguageModel
from lit.models import TransformerConfig
from tests.conftest import REPO, TINY_LM, TINY_VIT, free_port, subprocess_env

RECIPES, OVERLAYS = REPO / "recipes", REPO / "recipes" / "trainer"
SHORT = ["--trainer.max_steps=2", "--trainer.val_check_interval=2", "--trainer.check_val_every_n_epoch=null",
         "--trainer.limit_val_batches=1", "--trainer.accelerator=cpu"]
# The kinds of model; each entry is a recipe and the overrides that make it tiny.
MODELS = {
    "gpt_laurel_rw_lr_pa": TINY_LM,
    "gpt_ngpt": TINY_LM,
    "gpt_tokenformer": TINY_LM,
    "vit_ngpt_pattention": TINY_VIT,
    "vit_tokenformer_digits": TINY_VIT,
}


def overlay(name: str) -> list[str]:
    return ["--config", str(OVERLAYS / f"{name}.yaml")]


def recipe(name: str) -> list[str]:
    return ["--config", str(RECIPES / f"{name}.yaml"), *MODELS[name]]


def test_every_overlay_is_tested():
    tested = {"ddp", "fsdp", "bf16", "compile", "activation_checkpointing"}
    assert {p.stem for p in OVERLAYS.glob("*.yaml")} == tested


# LAUREL's overlay runs are all in the slow tier (bf16 and checkpointing here; compile, DDP and FSDP2 below): long on
# 2 cores, and each overlay's path is taken by default with the other recipes.
@pytest.mark.parametrize("name", [pytest.param(m, marks=pytest.mark.slow) if m == "gpt_laurel_rw_lr_pa" else m
                                  for m in MODELS])
@pytest.mark.parametrize("overlays", [["bf16"], ["activation_checkpointing"]])
def test_single_process_overlays(name, overlays, workdir):
    main(["fit", *recipe(name), *(a for o in overlays for a in overlay(o)), *SHORT, "--trainer.devices=1"])


# Compiled models are checked against eager ones in the default run (test_parallel.py, whole and per block); these
# CLI runs under the overlay take 40 s (LAUREL-PA) and about 2 minutes (the nGPT-Pattention ViT) on 2 cores, so `slow`.
@pytest.mark.parametrize("name", [pytest.param("gpt_laurel_rw_lr_pa", marks=pytest.mark.slow),
                                  pytest.param("vit_ngpt_pattention", marks=pytest.mark.slow)])
def test_compile_overlay(name, workdir):
    # Compiling takes tens of seconds on CPU: two recipes, both with a history-reading or unit-norm model.
    cli = main(["fit", *recipe(name), *overlay("compile"), *SHORT, "--trainer.devices=1"])
    assert cli.model.model._compiled_call_impl is not None  # the whole model, as one graph


def run_two_processes(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, str(REPO / "cli.py"), "fit", *args, "--trainer.devices=2",
                           "--trainer.enable_progress_bar=false"],
                          cwd=cwd, capture_output=True, text=True, timeout=400,
                          env=subprocess_env())
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


# The same 2-process FSDP2 fit runs by default through Lightning's launcher (test_fsdp2 below); the torchrun launch
# as 2 "nodes" takes about a minute of the default run, so it is in the slow tier.
@pytest.mark.slow
def test_two_nodes_launched_with_torchrun(tmp_path):
    """The multi-node command of docs/scaling.md, as 2 "nodes" of 1 CPU process each on this machine, sharing one folder
    (a shared filesystem: one MLflow store, one checkpoint directory)."""
    port = free_port()
    nodes = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1", f"--node-rank={rank}",
         "--master-addr=127.0.0.1", f"--master-port={port}", str(REPO / "cli.py"), "fit", *recipe("gpt_ngpt"),
         *overlay("fsdp"), *SHORT, "--trainer.num_nodes=2", "--trainer.devices=1",
         "--trainer.enable_progress_bar=false"],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env=subprocess_env()) for rank in (0, 1)]
    errors = [node.communicate(timeout=400)[1] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(e[-3000:] for e in errors)
    last = last_checkpoint(tmp_path)
    assert is_sharded(last) and len(list(last.glob("*.distcp"))) == 2  # one shard per node
    assert torch.load(last / "meta.pt", weights_only=True)["global_step"] == 2


def last_checkpoint(folder: Path) -> Path:
    (last,) = folder.glob("runs/*/*/checkpoints/last.ckpt")
    return last


# In the slow tier: DDP itself is checked against one process in test_distributed.py, this overlay launched by
# Lightning on 2 processes in test_resume.py (a NaN on one rank), and what DDP needs of a plugin (a gradient for
# every parameter) per plugin by the conformance kit (test_every_plugin.py).
@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt_laurel_rw_lr_pa", "vit_tokenformer_digits"])
def test_ddp(name, tmp_path):
    run_two_processes([*recipe(name), *overlay("ddp"), *SHORT], tmp_path)
    checkpoint = torch.load(last_checkpoint(tmp_path), weights_only=True)
    assert checkpoint["global_step"] == 2


# All in the slow tier (80 s of the default run for the broadest one, bf16 + activation checkpointing, on 2 shared
# cores). By default: FSDP2's equality with one process and nGPT's renormalisation on the shards in
# test_distributed.py and test_sharded_checkpoints.py (2 processes); the FSDP2 units with the chunked loss through
# them in test_fsdp_units.py; bf16 and activation checkpointing over these recipes on one process above.
@pytest.mark.slow
@pytest.mark.parametrize("name, extra", [
    ("gpt_ngpt", []),
    ("vit_ngpt_pattention", []),
    ("gpt_laurel_rw_lr_pa", ["activation_checkpointing"]),
    ("gpt_tokenformer", ["bf16", "activation_checkpointing"]),
])
def test_fsdp2(name, extra, tmp_path):
    run_two_processes([*recipe(name), *overlay("fsdp"), *(a for o in extra for a in overlay(o)), *SHORT], tmp_path)
    last = last_checkpoint(tmp_path)
    assert is_sharded(last) and len(list(last.glob("*.distcp"))) == 2  # one shard per rank
    full = torch.load(export(last, tmp_path / "full.ckpt"), weights_only=True)
    assert full["global_step"] == 2
    assert all(torch.isfinite(t).all() for t in full["state_dict"].values())
    if name == "gpt_ngpt":  # renormalised on the shards: the gathered weights are on the sphere
        arch = full["hyper_parameters"]["arch"]  # the CLI saves it as the dict it parsed
        model = LanguageModel(vocab_size=65, block_size=32, arch=TransformerConfig(**arch))
        model.load_state_dict(full["state_dict"])
        for param_name, param, dim in unit_norm_parameters(model):
            norms = param.detach().norm(dim=dim)
            torch.testing.assert_close(norms, torch.ones_like(norms), msg=param_name)
