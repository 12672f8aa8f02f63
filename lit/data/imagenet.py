"""ImageNet-1k (or any dataset) in the standard folder layout, with timm's training and eval transforms.

    <root>/train/<class>/*.JPEG
    <root>/val/<class>/*.JPEG

Augmentation is timm's own (RandAugment, random erasing, bicubic random-resized crop; Mixup/CutMix
and label smoothing in ``ImageDataModule``); the defaults are DeiT's recipe. Nothing is hand-written.
"""

from __future__ import annotations

from pathlib import Path

import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, create_transform
from torch.utils.data import DataLoader
from torchvision.datasets import ImageFolder

from lit.data.images import ImageDataModule
from lit.data.resumable import train_loader
from lit.errors import UserInputError

QUICKSTART = "recipes/vit_tokenformer_digits.yaml"


def _classes(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.is_dir())


class ImageFolderDataModule(ImageDataModule):
    """Images in ``root/{train,val}/<class>/``; ``num_classes`` comes from the folders.

    Args:
        root: the dataset folder (holding train/ and val/).
        image_size: training crop and evaluation size.
        batch_size: images per batch and process.
        num_workers: decoding processes per DataLoader.
        auto_augment: timm RandAugment/AutoAugment policy string, or None.
        re_prob: random-erasing probability.
        color_jitter: colour jitter strength (timm ignores it when auto_augment is set).
        crop_pct: evaluation centre-crop fraction (resize to image_size / crop_pct, then crop).
        interpolation: resize interpolation.
        mixup, cutmix, mix_prob, label_smoothing, seed: see ``ImageDataModule``.
    """

    def __init__(self, root: str | None = None, image_size: int = 224, batch_size: int = 128, num_workers: int = 8,
                 auto_augment: str | None = "rand-m9-mstd0.5-inc1", re_prob: float = 0.25, color_jitter: float = 0.3,
                 crop_pct: float = 0.875, interpolation: str = "bicubic", mixup: float = 0.8, cutmix: float = 1.0,
                 mix_prob: float = 1.0, label_smoothing: float = 0.1, seed: int | None = None):
        super().__init__(mixup, cutmix, mix_prob, label_smoothing, seed)
        self.root = self._check_root(root)
        self.num_classes = len(_classes(self.root / "train"))
        self.image_size, self.in_chans = image_size, 3
        self.batch_size, self.num_workers = batch_size, num_workers
        self.auto_augment, self.re_prob, self.color_jitter = auto_augment, re_prob, color_jitter
        self.crop_pct, self.interpolation = crop_pct, interpolation

    @staticmethod
    def _check_root(root: str | None) -> Path:
        how = (f"point --data.root at a folder holding train/<class>/*.JPEG and val/<class>/*.JPEG; "
               f"to train without ImageNet run `python cli.py fit --config {QUICKSTART}`")
        if root is None:
            raise UserInputError(f"no image folder given: {how}")
        path = Path(root).expanduser()
        if not (path / "train").is_dir() or not (path / "val").is_dir():
            raise UserInputError(f"image folder {path} has no train/ and val/ subfolders: {how}")
        train, val = _classes(path / "train"), _classes(path / "val")
        if not train:
            raise UserInputError(f"{path / 'train'} has no class folders: {how}")
        if train != val:
            missing = sorted(set(train) ^ set(val))[:3]
            raise UserInputError(f"train/ and val/ of {path} have different classes (e.g. {missing}); "
                                 "both need one folder per class, with the same names")
        return path

    def setup(self, stage: str | None = None) -> None:
        train_tf = create_transform(self.image_size, is_training=True, auto_augment=self.auto_augment,
                                    re_prob=self.re_prob, color_jitter=self.color_jitter,
                                    interpolation=self.interpolation, mean=IMAGENET_DEFAULT_MEAN,
                                    std=IMAGENET_DEFAULT_STD)
        eval_tf = create_transform(self.image_size, is_training=False, crop_pct=self.crop_pct,
                                   interpolation=self.interpolation, mean=IMAGENET_DEFAULT_MEAN,
                                   std=IMAGENET_DEFAULT_STD)
        self.train_set = ImageFolder(str(self.root / "train"), transform=train_tf)
        self.val_set = ImageFolder(str(self.root / "val"), transform=eval_tf)

    def _loader_options(self) -> dict:
        return dict(num_workers=self.num_workers, pin_memory=torch.cuda.is_available(),
                    persistent_workers=self.num_workers > 0)

    def train_dataloader(self) -> DataLoader:
        # Full batches in training (batch mixing pairs images), unless the whole set is one small batch.
        drop_last = len(self.train_set) >= self.batch_size
        return train_loader(self, self.train_set, self.batch_size, drop_last=drop_last, **self._loader_options())

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.batch_size, **self._loader_options())

    def test_dataloader(self) -> DataLoader:
        return self.val_dataloader()
