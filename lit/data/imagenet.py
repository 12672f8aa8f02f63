"""ImageNet-1k (or any dataset) in the standard folder layout, with timm's training and eval transforms.

    <root>/train/<class>/*.JPEG
    <root>/val/<class>/*.JPEG

or the same images packed into tar shards by ``python cli.py prepare-images`` (``<root>/meta.json``), read by
random access (``lit/data/sharded_images.py``): the same items in the same order, without listing every file.

Augmentation is timm's own (RandAugment, random erasing, bicubic random-resized crop; Mixup/CutMix
and label smoothing in ``ImageDataModule``); the defaults are DeiT's recipe, repeated augmentation (three
copies of each image per epoch, ``lit/data/resumable.py``) and ``pixel`` random erasing included. Nothing is
hand-written.

The splits: a minival of ``minival_fraction`` of train (1%, big_vision's ``train[99%:]``), drawn once with a fixed
seed whatever the run's seed, validates during training and is what sweeps tune on; ImageNet's val folder is the
test split, which sweeps report on. ``minival_fraction: 0`` validates on the val folder and has no test split.

An image that does not decode is skipped (another takes its place), named in a warning and counted
(``data/skipped_images``), or stops the run in one line: ``lit/data/bad_images.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, create_transform
from timm.data.random_erasing import RandomErasing
from torch.utils.data import DataLoader, Dataset, Subset
from torchvision.datasets import ImageFolder

from lit.data.bad_images import (
    DEFAULT_MAX_BAD_IMAGES,
    BadImageLedger,
    BadImagePolicy,
    SkipUnreadable,
    collate_with_skips,
)
from lit.data.image_decoding import decode_rgb
from lit.data.image_shard_format import check_image_folder, is_shard_directory, read_meta
from lit.data.images import ImageDataModule
from lit.data.resumable import train_loader
from lit.data.sharded_images import ShardedImages
from lit.errors import UserInputError

QUICKSTART = "recipes/vit_tokenformer_digits.yaml"
# The minival is the same images in every run, sweep and seed: its draw is not the run's seed.
MINIVAL_SEED = 0


class ImageFolderDataModule(ImageDataModule):
    """Images in ``root/{train,val}/<class>/``; ``num_classes`` comes from the folders.

    Args:
        root: the dataset folder (holding train/ and val/), or its shards (``cli.py prepare-images``).
        image_size: training crop and evaluation size.
        batch_size: images per batch and process.
        num_workers: decoding processes per DataLoader.
        auto_augment: timm RandAugment/AutoAugment policy string, or None.
        re_prob: random-erasing probability.
        re_mode: what erased boxes are filled with: ``pixel`` (per-pixel normal noise, DeiT's), ``rand`` (one
            random colour per box) or ``const`` (zeros, timm's default).
        repeated_augmentation: copies of each image per epoch, each augmented anew (DeiT: 3; 1: off). An epoch
            keeps its length in images, so it sees about 1/3 of the images thrice.
        minival_fraction: fraction of train held out as the validation split (sweeps tune on it); ImageNet's
            val folder becomes the test split. 0: validate on the val folder, no test split.
        normalize_on_device: the loader sends uint8 batches (a quarter of float32's bytes) and normalising and
            random erasing run on the device, after the transfer (timm's ``PrefetchLoader``); off: both run in
            the loader's workers, as ``ToTensor``/``Normalize``/``RandomErasing`` on each image.
        color_jitter: colour jitter strength (timm ignores it when auto_augment is set).
        crop_pct: evaluation centre-crop fraction (resize to image_size / crop_pct, then crop).
        interpolation: resize interpolation.
        on_bad_image: an image that does not decode is ``skip``ped (the split's next image takes its place; a warning
            names the file once) or stops the run at once (``error``), in one line naming it.
        max_bad_images: how many distinct files may fail to decode (per process, over the run) before a run that
            skips them stops, in one line: more say the data set is damaged. timm skips up to 50 in a row.
        mixup, cutmix, mix_prob, label_smoothing, seed: see ``ImageDataModule``.
    """

    def __init__(self, root: str | None = None, image_size: int = 224, batch_size: int = 128, num_workers: int = 8,
                 auto_augment: str | None = "rand-m9-mstd0.5-inc1", re_prob: float = 0.25,
                 re_mode: Literal["pixel", "rand", "const"] = "pixel", repeated_augmentation: int = 3,
                 minival_fraction: float = 0.01, normalize_on_device: bool = False, color_jitter: float = 0.3,
                 crop_pct: float = 0.875, interpolation: str = "bicubic", on_bad_image: BadImagePolicy = "skip",
                 max_bad_images: int = DEFAULT_MAX_BAD_IMAGES, mixup: float = 0.8, cutmix: float = 1.0,
                 mix_prob: float = 1.0, label_smoothing: float = 0.1, seed: int | None = None):
        super().__init__(mixup, cutmix, mix_prob, label_smoothing, seed)
        if not (isinstance(repeated_augmentation, int) and repeated_augmentation >= 1):
            raise UserInputError(f"--data.repeated_augmentation is the number of copies of each image per epoch, a "
                                 f"whole number >= 1 (1: off; DeiT uses 3), got {repeated_augmentation!r}")
        if not 0 <= minival_fraction < 1:
            raise UserInputError(f"--data.minival_fraction is the fraction of train held out for validation, in "
                                 f"[0, 1) (0: validate on val/), got {minival_fraction!r}")
        self.root, classes = self._check_root(root)
        self.sharded = is_shard_directory(self.root)
        self.num_classes = len(classes)
        self.image_size, self.in_chans = image_size, 3
        self.batch_size, self.num_workers = batch_size, num_workers
        self.auto_augment, self.re_prob, self.re_mode, self.color_jitter = auto_augment, re_prob, re_mode, color_jitter
        self.repeated_augmentation, self.minival_fraction = repeated_augmentation, minival_fraction
        self.has_test_split = minival_fraction > 0
        self.normalize_on_device = normalize_on_device
        self._eraser: RandomErasing | None = None
        self._normalizer: tuple[torch.Tensor, torch.Tensor] | None = None  # mean and std, on the batches' device
        self.bad_images = BadImageLedger(on_bad_image, max_bad_images)
        self.crop_pct, self.interpolation = crop_pct, interpolation

    @staticmethod
    def _check_root(root: str | None) -> tuple[Path, list[str]]:
        """The root and its classes; the root is an image folder or a shard directory (``meta.json``)."""
        how = (f"point --data.root at a folder holding train/<class>/*.JPEG and val/<class>/*.JPEG, or at its shards "
               f"(`python cli.py prepare-images`); to train without ImageNet run `python cli.py fit --config "
               f"{QUICKSTART}`")
        if root is None:
            raise UserInputError(f"no image folder given: {how}")
        path = Path(root).expanduser()
        if is_shard_directory(path):
            return path, read_meta(path)["classes"]
        return path, check_image_folder(path, how)

    def _split(self, split: str, transform) -> Dataset:
        """The ``train`` or ``val`` images, from the shards when the root holds them (the same items, in the same
        order, as the folder's: ``lit/data/sharded_images.py``)."""
        if self.sharded:
            return ShardedImages(self.root, split, transform)
        # torchvision's loader, whose decoding errors name the file (``lit/data/image_decoding.py``).
        return ImageFolder(str(self.root / split), transform=transform, loader=decode_rgb)

    def setup(self, stage: str | None = None) -> None:
        # use_prefetcher: timm's transforms end at a uint8 tensor, without normalising or erasing.
        train_tf = create_transform(self.image_size, is_training=True, auto_augment=self.auto_augment,
                                    re_prob=self.re_prob, re_mode=self.re_mode, color_jitter=self.color_jitter,
                                    interpolation=self.interpolation, mean=IMAGENET_DEFAULT_MEAN,
                                    std=IMAGENET_DEFAULT_STD, use_prefetcher=self.normalize_on_device)
        eval_tf = create_transform(self.image_size, is_training=False, crop_pct=self.crop_pct,
                                   interpolation=self.interpolation, mean=IMAGENET_DEFAULT_MEAN,
                                   std=IMAGENET_DEFAULT_STD, use_prefetcher=self.normalize_on_device)
        train = self._split("train", train_tf)
        if not self.has_test_split:
            self.train_set, self.val_set = train, self._split("val", eval_tf)
            return
        held, kept = minival_split(len(train), self.minival_fraction)
        # The same files as the minival, with the evaluation transform (the train transform augments).
        self.train_set = Subset(train, kept)
        self.val_set = Subset(self._split("train", eval_tf), held)
        self.test_set = self._split("val", eval_tf)

    def on_before_batch_transfer(self, batch, dataloader_idx: int):
        # On the host, before the move: the skipped images' names leave the batch here (``bad_images.py``).
        return self.bad_images.take(batch)

    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        if self.normalize_on_device:
            images, labels = batch
            batch = self._normalize_and_erase(images), labels
        return super().on_after_batch_transfer(batch, dataloader_idx)

    def _normalize_and_erase(self, images: torch.Tensor) -> torch.Tensor:
        """timm's ``PrefetchLoader`` step: uint8 -> normalised float, then (training only) random erasing."""
        # Made once per device, not per batch: each torch.tensor(..., device=) is a host-to-device copy, which a GPU
        # step would wait for (tests/test_syncs.py).
        if self._normalizer is None or self._normalizer[0].device != images.device:
            shape = (1, 3, 1, 1)
            self._normalizer = (
                torch.tensor([255 * m for m in IMAGENET_DEFAULT_MEAN], device=images.device).view(shape),
                torch.tensor([255 * s for s in IMAGENET_DEFAULT_STD], device=images.device).view(shape))
        mean, std = self._normalizer
        images = (images.float() - mean) / std
        trainer = getattr(self, "trainer", None)
        if self.re_prob > 0 and trainer is not None and trainer.training:
            if self._eraser is None or self._eraser.device != images.device:
                self._eraser = RandomErasing(self.re_prob, mode=self.re_mode, max_count=1, device=images.device)
            images = self._eraser(images)
        return images

    def _loader_options(self) -> dict:
        return dict(num_workers=self.num_workers, pin_memory=torch.cuda.is_available(),
                    persistent_workers=self.num_workers > 0, collate_fn=collate_with_skips)

    def _skipping(self, dataset: Dataset) -> SkipUnreadable:
        return SkipUnreadable(dataset, self.bad_images.on_bad_image, self.bad_images.max_bad_images)

    def train_dataloader(self) -> DataLoader:
        # Full batches in training (batch mixing pairs images); a set smaller than one batch is one batch, of an
        # even size when batches are mixed.
        batch, n = self.batch_size, len(self.train_set)
        if n < batch:
            batch = n - n % 2 if (self.mixup > 0 or self.cutmix > 0) and n > 1 else n
        return train_loader(self, self._skipping(self.train_set), batch, drop_last=True,
                            repeats=self.repeated_augmentation, seeded_samples=True, **self._loader_options())

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self._skipping(self.val_set), batch_size=self.batch_size, **self._loader_options())

    def test_dataloader(self) -> DataLoader:
        if not self.has_test_split:
            raise UserInputError("--data.minival_fraction is 0: val/ is the validation split and there is no test "
                                 "split; validate instead, or hold out a minival (e.g. --data.minival_fraction=0.01)")
        return DataLoader(self._skipping(self.test_set), batch_size=self.batch_size, **self._loader_options())


def minival_split(n: int, fraction: float) -> tuple[list[int], list[int]]:
    """(held out, kept): ``round(fraction * n)`` of train's ``n`` images (at least one), drawn with ``MINIVAL_SEED``."""
    held_count = max(1, round(fraction * n))
    if held_count >= n:
        raise UserInputError(f"--data.minival_fraction={fraction} holds out all {n} training images; use a smaller "
                             f"fraction or more images")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(MINIVAL_SEED)).tolist()
    return sorted(order[:held_count]), sorted(order[held_count:])
