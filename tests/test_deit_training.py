"""A ViT trained as DeiT trains it: pixel erasing, the minival, an EMA validated beside the raw weights, the learning
rate and warmup resolved from the global batch, and an exact mid-epoch resume with all of them and repeated
augmentation on."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import lightning as L
import mlflow
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lit.data import ImageFolderDataModule
from lit.data.imagenet import MINIVAL_SEED, minival_split
from lit.diagnostics import DiagnosticsConfig
from lit.errors import UserInputError
from lit.image_classifier import ImageClassifier
from lit.models.vit import VIT_ARCH
from tests.conftest import REPO, TINY_VIT, assert_same_weights_and_ema, make_image_folder, subprocess_env


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return make_image_folder(tmp_path_factory.mktemp("deit") / "imagenet", per_class=10)  # 20 train images


def data(root: Path, **kw) -> ImageFolderDataModule:
    options = dict(image_size=32, batch_size=4, num_workers=0, minival_fraction=0.1, seed=0)
    return ImageFolderDataModule(str(root), **{**options, **kw})


def erasing_of(dm: ImageFolderDataModule):
    from timm.data.random_erasing import RandomErasing

    transform = dm.train_set.dataset.transform
    (erasing,) = [t for t in transform.transforms if isinstance(t, RandomErasing)]
    return erasing


def test_random_erasing_fills_with_per_pixel_noise_by_default_and_can_be_const(folder):
    dm = data(folder)
    dm.setup("fit")
    assert erasing_of(dm).mode == "pixel" and erasing_of(dm).probability == 0.25
    const = data(folder, re_mode="const")
    const.setup("fit")
    assert erasing_of(const).mode == "const"


def test_the_minival_is_held_out_of_train_with_a_fixed_seed_and_val_is_the_test_split(folder):
    dm = data(folder, seed=7)
    dm.setup("fit")
    held, kept = minival_split(20, 0.1)
    assert MINIVAL_SEED == 0 and len(held) == 2 and sorted(held + kept) == list(range(20))
    assert dm.val_set.indices == held and dm.train_set.indices == kept  # the run's seed does not move it
    assert dm.val_set.dataset.root == dm.train_set.dataset.root == str(folder / "train")
    assert dm.test_set.root == str(folder / "val") and len(dm.test_set) == 20
    assert dm.has_test_split and minival_split(20, 0.1) == (held, kept)
    assert len(minival_split(1000, 0.01)[0]) == 10  # big_vision's 1%

    whole = data(folder, minival_fraction=0.0)
    whole.setup("fit")
    assert whole.val_set.root == str(folder / "val") and len(whole.train_set) == 20 and not whole.has_test_split
    with pytest.raises(UserInputError, match="no test split"):
        whole.test_dataloader()
    with pytest.raises(UserInputError, match="minival_fraction"):
        data(folder, minival_fraction=1.0)


def test_normalising_and_erasing_on_the_device_gives_the_cpu_paths_images(folder):
    cpu, device = data(folder), data(folder, normalize_on_device=True, re_prob=1.0, mixup=0.0, cutmix=0.0,
                                     label_smoothing=0.0)
    cpu.setup("fit")
    device.setup("fit")
    expected, labels = next(iter(cpu.val_dataloader()))
    raw, same_labels = next(iter(device.val_dataloader()))
    assert raw.dtype == torch.uint8 and torch.equal(labels, same_labels)  # a quarter of float32's bytes
    normalised, _ = device.on_after_batch_transfer((raw, labels), 0)  # not training: no erasing
    torch.testing.assert_close(normalised, expected, rtol=0, atol=1e-5)
    device.trainer = type("Training", (), {"training": True})()
    erased, _ = device.on_after_batch_transfer((raw, labels), 0)
    changed = (erased != normalised).flatten(1).any(dim=1)
    assert changed.all()  # re_prob 1: every image has a box of per-pixel noise
    assert device._eraser.mode == "pixel"


def tiny_classifier(**kw) -> ImageClassifier:
    arch = dataclasses.replace(VIT_ARCH, d_model=16, n_layers=2, n_heads=2, drop_path=0.1)
    options = dict(num_classes=2, image_size=32, patch_size=8, arch=arch, lr=2e-3, warmup_steps=0,
                   diagnostics=DiagnosticsConfig(interval=0))
    return ImageClassifier(**{**options, **kw})


def fit(folder: Path, checkpoints: Path, ckpt_path: str | None = None, **model) -> L.Trainer:
    L.seed_everything(0)
    module = tiny_classifier(**model)
    trainer = L.Trainer(accelerator="cpu", max_epochs=2, max_steps=6, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0,
                        callbacks=[ModelCheckpoint(checkpoints, filename="{step}", every_n_train_steps=1,
                                                   save_top_k=-1)])
    # Two workers: each draws augmentations from its own stream, which a resumed run's fresh workers restart.
    trainer.fit(module, datamodule=data(folder, re_prob=1.0, num_workers=2), ckpt_path=ckpt_path)
    return trainer


DEIT_OPTIONS = dict(ema_decay=0.9, lr_batch_size=512, warmup_epochs=1.0)


def test_a_mid_epoch_resume_with_repeated_augmentation_and_ema_is_bit_identical(folder, tmp_path):
    # 18 training images at batch 4: 4 steps per epoch; step 5 is one batch into the second epoch (max_epochs bounds
    # the run, so the DataLoader is built before the loop progress is restored). Every image is
    # erased (re_prob 1), repeated thrice per epoch, mixed, drop-path is on: every random stream is used.
    whole = fit(folder, tmp_path / "whole", **DEIT_OPTIONS)
    module = whole.lightning_module
    assert module.hparams.lr * 4 / 512 == pytest.approx(module.optimizers().param_groups[0]["initial_lr"])
    assert module.resolved_lr_and_warmup() == (pytest.approx(2e-3 * 4 / 512), 4, 4)  # warmup: one epoch of 4 steps
    fit(folder, tmp_path / "resumed", ckpt_path=str(tmp_path / "whole" / "step=5.ckpt"), **DEIT_OPTIONS)
    expected = assert_same_weights_and_ema(tmp_path / "whole" / "step=6.ckpt", tmp_path / "resumed" / "step=6.ckpt")
    # The EMA is an average, not the weights: the test above compares two different things.
    raw = expected["state_dict"]["model.head.weight"]
    assert not torch.equal(expected["ema_state_dict"]["module.head.weight"], raw)


def test_the_ema_is_validated_beside_the_raw_weights(folder, workdir):
    from lit.cli import main

    main(["fit", "--config", str(REPO / "recipes" / "vit_baseline.yaml"), f"--data.root={folder}",
          "--data.num_workers=0", "--data.image_size=32", "--data.batch_size=4", "--model.variant=null", *TINY_VIT,
          "--model.ema_decay=0.5", "--data.normalize_on_device=true", "--trainer.max_steps=2",
          "--trainer.limit_val_batches=1", "--trainer.val_check_interval=2", "--trainer.precision=32-true",
          "--model.diagnostics.interval=0"])
    client = mlflow.MlflowClient(f"sqlite:///{workdir}/mlflow.db")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    metrics = run.data.metrics
    assert {"val/acc1", "val_ema/acc1", "val_ema/loss", "val/loss"} <= metrics.keys()
    assert metrics["val_ema/loss"] != metrics["val/loss"]  # two models were evaluated, not one twice


def resolved(tmp_path: Path, processes: int) -> dict[str, float]:
    """``train/peak_lr`` and ``train/warmup_steps`` of a 1-step fit on ``processes`` gloo DDP processes."""
    folder = make_image_folder(tmp_path / "imagenet", per_class=10)
    args = [sys.executable, str(REPO / "cli.py"), "fit", "--config", str(REPO / "recipes" / "vit_baseline.yaml"),
            f"--data.root={folder}", "--data.num_workers=0", "--data.image_size=32", "--data.batch_size=2",
            "--model.variant=null", *TINY_VIT, "--trainer.max_steps=1", "--trainer.limit_val_batches=0",
            "--trainer.precision=32-true", "--model.diagnostics.interval=0", "--trainer.accumulate_grad_batches=2",
            "--model.lr=5.0e-4", "--model.lr_batch_size=512", "--model.warmup_epochs=5",
            "--trainer.accelerator=cpu", f"--trainer.devices={processes}",
            *(["--trainer.strategy=ddp"] if processes > 1 else [])]
    out = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, env=subprocess_env(), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    return {k: run.data.metrics[k] for k in ("train/peak_lr", "train/warmup_steps")}


def test_lr_and_warmup_are_resolved_from_processes_batch_and_accumulation(folder):
    """The arithmetic, with the trainer's facts stated (the real 2-process run is the slow test below)."""
    module = tiny_classifier(lr=5e-4, lr_batch_size=512, warmup_epochs=5)
    for world, expected_warmup in ((1, 25), (2, 10)):
        dm = data(folder, batch_size=2)
        trainer = type("Trainer", (), dict(world_size=world, global_rank=0, accumulate_grad_batches=2,
                                           limit_train_batches=1.0, datamodule=dm, fit_loop=None))()
        dm.trainer, module._trainer = trainer, trainer
        dm.setup("fit")
        lr, warmup, global_batch = module.resolved_lr_and_warmup()
        assert global_batch == 2 * world * 2 and lr == pytest.approx(5e-4 * global_batch / 512)
        assert warmup == expected_warmup  # 18 images: 9 (5 steps) or 4 (2 steps) batches per process and epoch


@pytest.mark.slow  # two gloo processes started by the CLI: ~40 s on 2 idle cores
def test_lr_and_warmup_follow_the_global_batch_on_one_and_two_processes(tmp_path):
    # 18 training images, batch 2 per process, 2 batches accumulated: global batch 4 on one process, 8 on two.
    one = resolved(tmp_path / "one", 1)
    two = resolved(tmp_path / "two", 2)
    assert one["train/peak_lr"] == pytest.approx(5e-4 * 4 / 512)
    assert two["train/peak_lr"] == pytest.approx(5e-4 * 8 / 512)
    # 5 epochs: 9 batches per process and epoch (5 optimizer steps) on one process, 4 (2 steps) on two.
    assert one["train/warmup_steps"] == 25 and two["train/warmup_steps"] == 10
