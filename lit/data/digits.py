"""The embedded image set: scikit-learn's handwritten digits (1,797 real 8x8 scans, 10 classes).

It ships inside scikit-learn, so every image recipe runs on a fresh CPU machine with no download.
The split is fixed (a seeded permutation, 20% validation), so runs compare.
"""

from __future__ import annotations

import torch
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

from lit.data.images import ImageDataModule
from lit.data.resumable import train_loader


class DigitsDataModule(ImageDataModule):
    """scikit-learn's digits as (1, 8, 8) images scaled to [-1, 1].

    Args:
        batch_size: images per batch.
        val_fraction: share of the images held out for validation.
        split_seed: seed of the fixed train/val permutation.
        mixup, cutmix, mix_prob, label_smoothing, seed: see ``ImageDataModule``.
    """

    def __init__(self, batch_size: int = 64, val_fraction: float = 0.2, split_seed: int = 0, mixup: float = 0.0,
                 cutmix: float = 0.0, mix_prob: float = 1.0, label_smoothing: float = 0.0, seed: int | None = None):
        super().__init__(mixup, cutmix, mix_prob, label_smoothing, seed)
        if not 0 < val_fraction < 1:
            raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
        self.batch_size, self.val_fraction, self.split_seed = batch_size, val_fraction, split_seed
        self.num_classes, self.image_size, self.in_chans = 10, 8, 1

    def setup(self, stage: str | None = None) -> None:
        digits = load_digits()
        images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 8.0 - 1.0  # pixels are 0..16
        labels = torch.tensor(digits.target, dtype=torch.long)
        order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(self.split_seed))
        n_val = int(len(labels) * self.val_fraction)
        self.val_set = TensorDataset(images[order[:n_val]], labels[order[:n_val]])
        self.train_set = TensorDataset(images[order[n_val:]], labels[order[n_val:]])

    def train_dataloader(self) -> DataLoader:
        # drop_last: batch mixing pairs images within a batch and needs an even batch size.
        return train_loader(self, self.train_set, self.batch_size)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=256)

    def test_dataloader(self) -> DataLoader:
        return self.val_dataloader()
