"""Image data: the embedded digits, an ImageNet-layout folder of JPEGs, batch mixing, and bad roots."""

from __future__ import annotations

import pytest
import torch

from lit.cli import main
from lit.data.digits import DigitsDataModule
from lit.data.imagenet import ImageFolderDataModule
from lit.errors import UserInputError
from tests.conftest import REPO, TINY_VIT, assert_same_weights_and_ema


def test_digits_are_real_and_split_deterministically():
    a, b = DigitsDataModule(), DigitsDataModule()
    a.setup(), b.setup()
    assert (len(a.train_set), len(a.val_set), len(a.test_set)) == (1079, 359, 359)
    assert torch.equal(a.val_set.tensors[0], b.val_set.tensors[0])
    # Validation is the first 20% of the seeded permutation, as before the test split; the test split is
    # stratified (each class's share of the whole set) and shares no image with train or validation.
    order = torch.randperm(1797, generator=torch.Generator().manual_seed(0))
    from sklearn.datasets import load_digits
    digits = torch.tensor(load_digits().images, dtype=torch.float32).unsqueeze(1) / 8.0 - 1.0
    assert torch.equal(a.val_set.tensors[0], digits[order[:359]])
    counts = torch.bincount(torch.tensor(load_digits().target), minlength=10)
    assert torch.equal(torch.bincount(a.test_set.tensors[1], minlength=10), torch.round(0.2 * counts).long())
    flat = {tuple(x.flatten().tolist()) for x in a.train_set.tensors[0]}
    assert not flat & {tuple(x.flatten().tolist()) for x in a.test_set.tensors[0]}
    assert not flat & {tuple(x.flatten().tolist()) for x in a.val_set.tensors[0]}
    images, labels = a.train_set.tensors
    assert images.shape[1:] == (1, 8, 8) and images.min() == -1 and images.max() == 1
    assert set(labels.tolist()) == set(range(10))
    assert (a.num_classes, a.image_size, a.in_chans) == (10, 8, 1)


def test_image_folder_reads_jpegs_with_timm_transforms(image_folder):
    dm = ImageFolderDataModule(str(image_folder), image_size=32, batch_size=4, num_workers=0)
    assert dm.num_classes == 2
    dm.setup("fit")
    images, labels = next(iter(dm.train_dataloader()))
    assert images.shape == (4, 3, 32, 32) and labels.dtype == torch.long
    val_images, _ = next(iter(dm.val_dataloader()))
    assert val_images.shape[1:] == (3, 32, 32)
    assert len(dm.train_dataloader()) == 1  # 6 images, batch 4: the partial batch is dropped (mixing pairs)


def test_a_set_smaller_than_one_batch_still_trains(image_folder):
    dm = ImageFolderDataModule(str(image_folder), image_size=32, batch_size=128, num_workers=0)
    dm.setup("fit")
    assert len(dm.train_dataloader()) == 1


class _Training:
    training = True


def test_mixup_cutmix_and_smoothing_make_probability_targets():
    dm = DigitsDataModule(mixup=0.8, cutmix=1.0, label_smoothing=0.1)
    dm.trainer = _Training()
    images, labels = torch.randn(4, 1, 8, 8), torch.tensor([0, 1, 2, 3])
    original = images.clone()  # timm mixes in place
    mixed, targets = dm.on_after_batch_transfer((images, labels), 0)
    assert targets.shape == (4, 10) and torch.allclose(targets.sum(1), torch.ones(4))
    assert not torch.equal(mixed, original)
    smooth = DigitsDataModule(label_smoothing=0.1)
    smooth.trainer = _Training()
    _, targets = smooth.on_after_batch_transfer((images, labels), 0)
    assert targets[0, 0].item() == pytest.approx(0.91) and targets[0, 1].item() == pytest.approx(0.01)
    plain = DigitsDataModule()
    plain.trainer = _Training()
    assert plain.on_after_batch_transfer((images, labels), 0)[1] is labels


def test_bad_roots_are_one_clear_error(tmp_path):
    with pytest.raises(UserInputError, match="point --data.root at"):
        ImageFolderDataModule(None)
    with pytest.raises(UserInputError, match="no train/ and val/"):
        ImageFolderDataModule(str(tmp_path))
    (tmp_path / "train" / "a").mkdir(parents=True)
    (tmp_path / "val" / "b").mkdir(parents=True)
    with pytest.raises(UserInputError, match="different classes"):
        ImageFolderDataModule(str(tmp_path))


def test_imagenet_recipe_without_root_says_how_to_point_at_it(workdir, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(REPO / "recipes/vit_tokenformer.yaml"), "--trainer.fast_dev_run=true"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "--data.root" in err and "recipes/vit_tokenformer_digits.yaml" in err


def test_classifier_learns_digits(workdir):
    """A few epochs through the CLI: well above chance (10%), with the metrics logged."""
    # 8 epochs of the 1,079 training images: about the optimizer steps 6 epochs took before the test split.
    cli = main(["fit", "--config", str(REPO / "recipes/vit_tokenformer_digits.yaml"), *TINY_VIT,
                "--trainer.max_epochs=8"])
    metrics = cli.trainer.callback_metrics
    assert metrics["val/acc1"] > 0.6, metrics
    assert {"train/loss", "train/acc", "val/loss", "val/acc5", "train/images_per_s"} <= set(metrics)


@pytest.mark.parametrize("source", ["folder", "shards"])
def test_a_mid_epoch_resume_with_normalising_and_erasing_on_the_device_is_bit_identical(tmp_path, source):
    """``normalize_on_device`` erases after the transfer, from the training process's random stream (not the
    sample's seed): a run resumed mid-epoch must draw the same boxes and noise, as the checkpoint's random states
    promise; from the folder and from its shards (``cli.py prepare-images``). Every image is erased (re_prob 1) and
    mixed, drop-path is on, repeated augmentation; loaded in the training process, whose random stream the erasing
    shares (the seeded samples restore it after each load)."""
    import dataclasses

    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    from lit.diagnostics import DiagnosticsConfig
    from lit.image_classifier import ImageClassifier
    from lit.models.vit import VIT_ARCH
    from tests.conftest import make_image_folder

    folder = make_image_folder(tmp_path / "imagenet", per_class=10)  # 18 train images after the minival: 4 steps/epoch
    if source == "shards":
        from lit.data.prepare_images import pack

        pack(folder, tmp_path / "shards", shard_bytes=1 << 16, progress_every=0)  # several shards
        folder = tmp_path / "shards"

    def fit(checkpoints, ckpt_path=None) -> None:
        L.seed_everything(0)
        arch = dataclasses.replace(VIT_ARCH, d_model=16, n_layers=2, n_heads=2, drop_path=0.1)
        module = ImageClassifier(num_classes=2, image_size=32, patch_size=8, arch=arch, lr=2e-3, warmup_steps=0,
                                 ema_decay=0.9, diagnostics=DiagnosticsConfig(interval=0))
        dm = ImageFolderDataModule(str(folder), image_size=32, batch_size=4, num_workers=0, minival_fraction=0.1,
                                   seed=0, re_prob=1.0, normalize_on_device=True)
        trainer = L.Trainer(accelerator="cpu", max_epochs=2, max_steps=6, logger=False, enable_progress_bar=False,
                            enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
                            callbacks=[ModelCheckpoint(checkpoints, filename="{step}", every_n_train_steps=1,
                                                       save_top_k=-1)])
        trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)

    fit(tmp_path / "whole")
    fit(tmp_path / "resumed", ckpt_path=str(tmp_path / "whole" / "step=5.ckpt"))  # one batch into epoch 2
    assert_same_weights_and_ema(tmp_path / "whole" / "step=6.ckpt", tmp_path / "resumed" / "step=6.ckpt")


@pytest.mark.parametrize("num_classes, k", [(10, 5), (3, 3)])
def test_test_logs_top5_beside_top1_and_top_k_of_the_classes_below_five(num_classes, k):
    # DeiT and timm report Acc@5 on val/, the test split here; with fewer than 5 classes it is top-k, k = the
    # class count (so 1.0), as val/acc5 is. The reference is computed from the same model's logits, here.
    import dataclasses

    import lightning as L
    from torch.utils.data import TensorDataset

    from lit.diagnostics import DiagnosticsConfig
    from lit.image_classifier import ImageClassifier
    from lit.models.vit import VIT_ARCH

    L.seed_everything(0)
    arch = dataclasses.replace(VIT_ARCH, d_model=16, n_layers=1, n_heads=2)
    module = ImageClassifier(num_classes=num_classes, image_size=8, patch_size=4, arch=arch, ema_decay=0.9,
                             diagnostics=DiagnosticsConfig(interval=0))
    images, labels = torch.randn(40, 3, 8, 8), torch.randint(0, num_classes, (40,))
    data = L.LightningDataModule.from_datasets(test_dataset=TensorDataset(images, labels), batch_size=16)
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    metrics = trainer.test(module, datamodule=data, verbose=False)[0]
    module.eval()
    with torch.no_grad():
        logits = module(images)
    top = logits.topk(k, dim=-1).indices
    assert metrics["test/acc5"] == pytest.approx((top == labels[:, None]).any(-1).float().mean().item(), abs=1e-6)
    assert metrics["test/acc1"] == pytest.approx((top[:, 0] == labels).float().mean().item(), abs=1e-6)
    assert "test_ema/acc5" in metrics and (k < num_classes or metrics["test/acc5"] == 1.0)
