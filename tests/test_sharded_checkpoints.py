"""FSDP2 checkpoints: sharded save and resume, the same weights as one process, a one-file export that loads anywhere.

One 2-process FSDP2 run of nGPT (unit-norm weights renormalised on DTensor shards, some along the sharded
dim) trains 4 steps at batch 4 per rank and keeps the sharded checkpoints of steps 2 and 4. Everything
else is compared with it: a resume of its step-2 checkpoint under FSDP2, one process at batch 8 (the
same global batches, thanks to the sampler), and one process resuming the exported step-2 file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lit.checkpoints import export, is_sharded
from lit.cli import main
from tests.conftest import REPO, TINY_LM
from tests.test_overlays import run_two_processes

NGPT = ["--config", str(REPO / "recipes" / "gpt_ngpt.yaml"), *TINY_LM, "--trainer.accelerator=cpu",
        "--trainer.max_steps=4", "--trainer.val_check_interval=null", "--trainer.limit_val_batches=0",
        "--checkpoint.every_n_train_steps=2", "--checkpoint.save_top_k=-1"]
FSDP = ["--config", str(REPO / "recipes" / "trainer" / "fsdp.yaml")]
# Adam divides by sqrt(v): gradients that differ in their last bits between 1 and 2 processes (FSDP2
# reduce-scatters and sums squares per shard) move a few entries by up to ~1e-3 * lr (tests/test_distributed.py).
ACROSS_WORLD_SIZES = 1e-4


def checkpoints(folder: Path) -> dict[str, Path]:
    (ckpt_dir,) = folder.glob("runs/*/*/checkpoints")
    return {p.name: p for p in ckpt_dir.iterdir()}


PROBE = ["--trainer.callbacks+=tests.sharded_build_probe.RecordBuild"]


@pytest.fixture(scope="module")
def sharded_run_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("fsdp")
    run_two_processes([*NGPT, *FSDP, *PROBE], folder)
    return folder


@pytest.fixture(scope="module")
def sharded_run(sharded_run_folder) -> dict[str, Path]:
    return checkpoints(sharded_run_folder)


def weights(path: Path, tmp_path: Path) -> dict[str, torch.Tensor]:
    if is_sharded(path):
        path = export(path, tmp_path / f"{path.name}.exported")
    return torch.load(path, map_location="cpu", weights_only=True)["state_dict"]


def assert_same_weights(got: dict, expected: dict, atol: float) -> None:
    assert got.keys() == expected.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(got[name], tensor, rtol=0, atol=atol, msg=name)


def test_checkpoints_are_sharded_per_rank(sharded_run):
    assert {"epoch=0-step=2.ckpt", "epoch=0-step=4.ckpt", "last.ckpt"} <= sharded_run.keys()
    for path in sharded_run.values():
        assert is_sharded(path) and sorted(p.name for p in path.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]


def test_a_sharded_checkpoint_resumes_under_fsdp2(sharded_run, tmp_path):
    run_two_processes([*NGPT, *FSDP, f"--ckpt_path={sharded_run['epoch=0-step=2.ckpt']}"], tmp_path)
    resumed = checkpoints(tmp_path)["epoch=0-step=4.ckpt"]
    assert "epoch=0-step=2.ckpt" not in checkpoints(tmp_path)  # it continued from step 2, it did not start over
    assert_same_weights(weights(resumed, tmp_path), weights(sharded_run["epoch=0-step=4.ckpt"], tmp_path), atol=1e-6)


def test_fsdp2_on_two_processes_trains_what_one_process_trains(sharded_run, workdir):
    main(["fit", *NGPT, "--trainer.devices=1", "--data.batch_size=8"])  # the same global batch of 8
    single = checkpoints(workdir)["epoch=0-step=4.ckpt"]
    expected = weights(sharded_run["epoch=0-step=4.ckpt"], workdir)
    moved = max((expected[n] - w).abs().max().item() for n, w in weights(sharded_run["epoch=0-step=2.ckpt"],
                                                                         workdir).items())
    assert moved > 10 * ACROSS_WORLD_SIZES  # two more steps change the weights far more than the tolerance
    assert_same_weights(weights(single, workdir), expected, atol=ACROSS_WORLD_SIZES)


def test_the_exported_file_resumes_and_evaluates_on_one_process(sharded_run, workdir):
    exported = export(sharded_run["epoch=0-step=2.ckpt"], workdir / "step2.ckpt")
    checkpoint = torch.load(exported, weights_only=True)
    assert checkpoint["global_step"] == 2 and len(checkpoint["optimizer_states"]) == 1
    main(["fit", *NGPT, "--trainer.devices=1", "--data.batch_size=8", f"--ckpt_path={exported}"])
    resumed = checkpoints(workdir)["epoch=0-step=4.ckpt"]
    assert_same_weights(weights(resumed, workdir), weights(sharded_run["epoch=0-step=4.ckpt"], workdir),
                        atol=ACROSS_WORLD_SIZES)
    cli = main(["validate", *NGPT, "--trainer.devices=1", "--trainer.limit_val_batches=2",
                f"--ckpt_path={export(sharded_run['last.ckpt'], workdir / 'last.ckpt')}"])
    assert torch.isfinite(cli.trainer.callback_metrics["val/loss"])


def test_a_sharded_checkpoint_of_another_architecture_is_one_line(sharded_run, workdir, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(REPO / "recipes" / "gpt_baseline.yaml"), *TINY_LM,
              f"--ckpt_path={sharded_run['last.ckpt']}"])
    assert exit_info.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "does not fit this model" in errors[0], errors


def test_rank_1_builds_on_meta_and_starts_from_rank_0s_weights_buffers_and_generator(sharded_run_folder):
    # lit/sharded_build.py: rank 0 builds, rank 1 only shapes; after sharding rank 1 holds rank 0's weights,
    # buffers and random-number state, so the run is the one where both built the whole model (slow test below).
    read = (lambda folder, rank: json.loads((folder / f"built_on_meta.rank{rank}.json").read_text()))
    assert [read(sharded_run_folder, rank) for rank in (0, 1)] == [False, True]
    starts = [torch.load(sharded_run_folder / f"start.rank{rank}.pt") for rank in (0, 1)]
    for key in ("parameters", "buffers"):
        assert starts[0][key].keys() == starts[1][key].keys() and starts[0][key]
        for name, tensor in starts[0][key].items():
            assert torch.equal(starts[1][key][name], tensor), name
    assert torch.equal(starts[0]["rng"], starts[1]["rng"])


@pytest.mark.slow  # one more 2-process run (~40 s on 2 shared cores); the identical start above implies it
def test_building_on_meta_trains_bit_identically_to_building_everywhere(sharded_run, tmp_path):
    run_two_processes([*NGPT, *FSDP, *PROBE, "--trainer.strategy.init_args.build_on_meta=false"], tmp_path)
    assert [json.loads((tmp_path / f"built_on_meta.rank{rank}.json").read_text()) for rank in (0, 1)] == [False] * 2
    assert_same_weights(weights(checkpoints(tmp_path)["epoch=0-step=4.ckpt"], tmp_path),
                        weights(sharded_run["epoch=0-step=4.ckpt"], tmp_path), atol=0)
